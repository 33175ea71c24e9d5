//! The NBD client's handshake (`blockio::nbd`) against what a hostile or
//! broken server sends: the input is every byte the server sends, from its
//! greeting to its replies to `NBD_OPT_GO`. Whatever the server says, the
//! client returns an export it can use or a message, within a bounded
//! read (no reply longer than 1 MiB, at most 16 of them), and never
//! panics. The same bytes are also played to an `nbds` client up to its
//! TLS handshake (the greeting, then the reply to `NBD_OPT_STARTTLS`).

/// The export the client asks for.
const EXPORT: &str = "swap";

/// Runs one input: the server's side of the conversation.
pub fn run(data: &[u8]) {
    match blockio::nbd::negotiate_replayed(data, EXPORT) {
        Ok(export) => {
            assert!(
                export.min_block_bytes.is_power_of_two(),
                "accepted a minimum block size of {}",
                export.min_block_bytes
            );
            assert!(
                export.max_block_bytes >= export.min_block_bytes
                    && export.preferred_block_bytes >= export.min_block_bytes,
                "accepted block sizes out of order: {export:?}"
            );
        }
        Err(message) => assert!(!message.is_empty(), "an empty message"),
    }
    if let Err(message) = blockio::nbd::start_tls_replayed(data) {
        assert!(!message.is_empty(), "an empty message");
    }
}

/// What a well-behaved server sends for `export_bytes` bytes, then the
/// replies in `extra` before its acknowledgement: the seeds' raw material.
pub fn server_bytes(size_bytes: u64, block_sizes: Option<[u32; 3]>, extra: &[Vec<u8>]) -> Vec<u8> {
    const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
    const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
    let mut out = Vec::new();
    out.extend_from_slice(&NBDMAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    // Fixed newstyle, no zeroes.
    out.extend_from_slice(&3u16.to_be_bytes());
    let mut info_export = 0u16.to_be_bytes().to_vec();
    info_export.extend_from_slice(&size_bytes.to_be_bytes());
    // HAS_FLAGS | SEND_FLUSH | SEND_FUA.
    info_export.extend_from_slice(&0b1101u16.to_be_bytes());
    out.extend(option_reply(3, &info_export));
    if let Some(sizes) = block_sizes {
        let mut info = 3u16.to_be_bytes().to_vec();
        for size in sizes {
            info.extend_from_slice(&size.to_be_bytes());
        }
        out.extend(option_reply(3, &info));
    }
    for reply in extra {
        out.extend_from_slice(reply);
    }
    out.extend(option_reply(1, &[]));
    out
}

/// One reply to `NBD_OPT_GO` of type `reply` with `payload`.
pub fn option_reply(reply: u32, payload: &[u8]) -> Vec<u8> {
    const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
    const OPT_GO: u32 = 7;
    let mut out = OPT_REPLY_MAGIC.to_be_bytes().to_vec();
    out.extend_from_slice(&OPT_GO.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply of type `reply` to option `option`.
    fn reply_to(option: u32, reply: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = option_reply(reply, payload);
        out[8..12].copy_from_slice(&option.to_be_bytes());
        out
    }

    #[test]
    fn a_well_behaved_server_is_accepted_and_hostile_ones_get_a_message() {
        let good = server_bytes(64 << 20, Some([512, 4096, 1 << 25]), &[]);
        let export = blockio::nbd::negotiate_replayed(&good, EXPORT).expect("a good server");
        assert_eq!(export.size_bytes, 64 << 20);
        assert_eq!(
            (export.min_block_bytes, export.max_block_bytes),
            (512, 1 << 25)
        );
        // Block sizes no client could honour.
        let bad = server_bytes(64 << 20, Some([3, 4096, 1 << 20]), &[]);
        let err = blockio::nbd::negotiate_replayed(&bad, EXPORT).unwrap_err();
        assert!(err.contains("impossible block sizes"), "{err}");
        // A server that never acknowledges: bounded, not read for ever.
        let flood: Vec<Vec<u8>> = (0..40).map(|_| option_reply(3, &[0, 9])).collect();
        let err = blockio::nbd::negotiate_replayed(&server_bytes(1 << 20, None, &flood), EXPORT)
            .unwrap_err();
        assert!(err.contains("more than 16 replies"), "{err}");
        // An nbds client: the acknowledgement of NBD_OPT_STARTTLS is what
        // starts TLS; a refusal or another option's reply is an error
        // that says what to do, and nothing goes on in the clear.
        let greeting = &good[..18];
        let mut ack = greeting.to_vec();
        ack.extend(reply_to(5, 1, &[]));
        assert_eq!(blockio::nbd::start_tls_replayed(&ack), Ok(()));
        let mut refused = greeting.to_vec();
        refused.extend(reply_to(5, (1 << 31) | 2, b"no TLS here"));
        let err = blockio::nbd::start_tls_replayed(&refused).unwrap_err();
        assert!(
            err.contains("does not offer TLS") && err.contains("no TLS here"),
            "{err}"
        );
        let mut wrong = greeting.to_vec();
        wrong.extend(reply_to(7, 1, &[]));
        assert!(blockio::nbd::start_tls_replayed(&wrong).is_err());
        for len in 0..ack.len() {
            run(&ack[..len]);
            assert!(blockio::nbd::start_tls_replayed(&ack[..len]).is_err());
        }
        // A truncated conversation at every length.
        for len in 0..good.len() {
            run(&good[..len]);
            assert!(blockio::nbd::negotiate_replayed(&good[..len], EXPORT).is_err());
        }
    }
}
