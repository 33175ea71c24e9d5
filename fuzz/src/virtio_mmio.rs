//! The virtio-mmio register interface on its own: no handshake is done for
//! the fuzzer, which drives the status machine, feature selection and
//! queue registers (any offset, any access width) and the configuration
//! space of a virtio-blk or a virtio-balloon transport, with guest memory
//! writes and notifications mixed in.

use devices::virtio::{Block, Disk};

use crate::input::Input;
use crate::virtio::{guest_memory, transport, Driver};
use crate::virtio_balloon::checked_balloon;

/// Runs one input: a byte choosing the device, then the operations.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let mem = guest_memory();
    if input.u8() & 1 == 0 {
        let mut transport = transport(checked_balloon(), &mem);
        Driver::new(&mut transport, &mem).run(&mut input);
    } else {
        let disk = Disk::open_with(&crate::virtio_blk::disk_path(), false, false)
            .expect("open the fuzz disk");
        let mut transport = transport(Block::new(disk), &mem);
        Driver::new(&mut transport, &mem).run(&mut input);
    }
}
