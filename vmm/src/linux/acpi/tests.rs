//! Whole-image tests: the tables are found the way a kernel finds them,
//! and, where ACPICA's `iasl` is installed (CI installs acpica-tools),
//! disassembled by it and the DSDT recompiled to the same AML.

use super::*;
use crate::linux::machine::VirtioMmioDevice;

fn machine(vcpus: u32, devices: u32) -> MachineInfo {
    MachineInfo {
        vcpus,
        virtio: (0..devices)
            .map(|i| VirtioMmioDevice {
                base_gpa: 0xd000_0000 + u64::from(i) * 0x1000,
                size_bytes: 0x1000,
                irq: 5 + i,
            })
            .collect(),
        virtio_in_dsdt: true,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// A table in the image by guest address, checked for length and checksum.
fn table_at(tables: &AcpiTables, gpa: u64) -> &[u8] {
    let at = (gpa - ACPI_GPA) as usize;
    let len = u32_at(&tables.image, at + 4) as usize;
    let table = &tables.image[at..at + len];
    assert_eq!(
        table.iter().fold(0u8, |s, b| s.wrapping_add(*b)),
        0,
        "checksum of {:?}",
        String::from_utf8_lossy(&table[..4])
    );
    table
}

#[test]
fn a_kernel_finds_every_table_from_the_rsdp() {
    let tables = build(&machine(2, 2)).unwrap();
    assert_eq!(tables.rsdp_gpa, ACPI_GPA);
    assert_eq!(tables.rsdp_gpa % 16, 0);
    let rsdp = &tables.image[..36];
    assert_eq!(&rsdp[..8], b"RSD PTR ");
    let xsdt = table_at(&tables, u64_at(rsdp, 24));
    assert_eq!(&xsdt[..4], b"XSDT");
    let listed: Vec<u64> = xsdt[36..].chunks(8).map(|c| u64_at(c, 0)).collect();
    let signatures: Vec<&[u8]> = listed.iter().map(|g| &table_at(&tables, *g)[..4]).collect();
    assert_eq!(signatures, [b"FACP", b"APIC"]);
    let rsdt = table_at(&tables, u64::from(u32_at(rsdp, 16)));
    let listed32: Vec<u64> = rsdt[36..]
        .chunks(4)
        .map(|c| u64::from(u32_at(c, 0)))
        .collect();
    assert_eq!(listed32, listed);
    let fadt = table_at(&tables, listed[0]);
    let dsdt = table_at(&tables, u64_at(fadt, 140));
    assert_eq!(&dsdt[..4], b"DSDT");
    assert_eq!(u64::from(u32_at(fadt, 40)), u64_at(fadt, 140));
    // Every placed table is in the list, inside the image.
    assert_eq!(tables.tables.len(), 6);
    for t in &tables.tables {
        let at = (t.gpa - ACPI_GPA) as usize;
        assert_eq!(&tables.image[at..at + t.bytes.len()], &t.bytes[..]);
    }
}

#[test]
fn cmdline_only_devices_stay_out_of_the_dsdt() {
    let mut m = machine(1, 2);
    let dsdt_of = |m: &MachineInfo| {
        let tables = build(m).unwrap();
        tables
            .tables
            .into_iter()
            .find(|t| t.signature == "DSDT")
            .unwrap()
            .bytes
    };
    let has_device = |dsdt: &[u8]| dsdt.windows(8).any(|w| w == b"LNRO0005");
    // The console is listed either way.
    assert!(dsdt_of(&m).windows(4).any(|w| w == b"COM1"));
    assert!(has_device(&dsdt_of(&m)));
    m.virtio_in_dsdt = false;
    assert!(!has_device(&dsdt_of(&m)));
}

#[test]
fn machine_limits_are_errors() {
    assert_eq!(
        build(&machine(0, 0)),
        Err(AcpiError::VcpuCount { vcpus: 0 })
    );
    assert_eq!(
        build(&machine(255, 0)),
        Err(AcpiError::VcpuCount { vcpus: 255 })
    );
    let largest = build(&machine(MAX_VCPUS, 19)).unwrap();
    assert!(largest.image.len() as u64 <= ACPI_MAX_BYTES);
}

/// Runs `iasl` in `dir`; `None` (with a SKIP line) where it is missing.
fn iasl(dir: &std::path::Path, args: &[&str]) -> Option<std::process::Output> {
    match std::process::Command::new("iasl")
        .args(args)
        .current_dir(dir)
        .output()
    {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            test_resources::skip(
                "acpi iasl check",
                test_resources::Resource::Iasl,
                "no iasl; apt-get install acpica-tools (.ci/run does)",
            );
            None
        }
        Err(e) => panic!("cannot run iasl: {e}"),
    }
}

#[test]
fn acpica_disassembles_the_tables_and_recompiles_the_dsdt_to_the_same_aml() {
    let tables = build(&machine(2, 2)).unwrap();
    let dir = ScratchDir::new("acpi-iasl");
    for t in &tables.tables {
        let name = format!("{}.dat", t.signature.to_lowercase());
        std::fs::write(dir.path().join(name), &t.bytes).unwrap();
    }
    let Some(_) = iasl(dir.path(), &["-v"]) else {
        return;
    };
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    for sig in ["facp", "apic", "dsdt"] {
        let out = iasl(dir.path(), &["-d", &format!("{sig}.dat")]).unwrap();
        let log = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "iasl -d {sig}.dat:\n{log}");
        let dsl = read(&format!("{sig}.dsl"));
        assert!(!dsl.contains("Invalid"), "{sig}:\n{dsl}");
        assert!(!dsl.contains("Incorrect checksum"), "{sig}:\n{dsl}");
        assert!(!dsl.to_lowercase().contains("error"), "{sig}:\n{dsl}");
    }
    let fadt = read("facp.dsl");
    // iasl labels flags like "Hardware Reduced (V5) : 1"; the suffix varies
    // between versions.
    for flag in [
        "Hardware Reduced",
        "Reset Register Supported",
        "CMOS RTC Not Present",
    ] {
        let set = fadt
            .lines()
            .any(|l| l.trim_start().starts_with(flag) && l.trim_end().ends_with(": 1"));
        assert!(set, "FADT flag {flag:?} not set:\n{fadt}");
    }
    let madt = read("apic.dsl");
    assert_eq!(madt.matches("[Processor Local APIC]").count(), 2, "{madt}");
    assert_eq!(madt.matches("[I/O APIC]").count(), 1, "{madt}");
    let dsdt = read("dsdt.dsl");
    for want in [
        "Device (COM1)",
        "Name (_HID, EisaId (\"PNP0501\")",
        "IO (Decode16,",
        "IRQNoFlags ()",
        "Device (V000)",
        "Device (V001)",
        "Name (_HID, \"LNRO0005\")",
        "Memory32Fixed (ReadWrite,",
        "0xD0001000,",
        "Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive, ,, )",
        "Name (\\_S5, Package (0x04)",
    ] {
        assert!(dsdt.contains(want), "DSDT lacks {want:?}:\n{dsdt}");
    }
    // Recompile the disassembly: the AML after the header must be ours.
    // -on: iasl would otherwise shorten `\\_SB` to `_SB_` (same meaning).
    let out = iasl(dir.path(), &["-on", "-p", "recompiled", "dsdt.dsl"]).unwrap();
    assert!(
        out.status.success(),
        "iasl dsdt.dsl:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let recompiled = std::fs::read(dir.path().join("recompiled.aml")).unwrap();
    let ours = &tables
        .tables
        .iter()
        .find(|t| t.signature == "DSDT")
        .unwrap()
        .bytes;
    assert_eq!(
        &recompiled[sdt::HEADER_BYTES..],
        &ours[sdt::HEADER_BYTES..],
        "iasl encodes the same DSDT differently"
    );
}

/// A directory removed when dropped.
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new(what: &str) -> Self {
        let path = std::env::temp_dir().join(format!("hugevmm-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
