//! The `--disk PATH[,readonly]` value (`devices::virtio::DiskSpec`).

use devices::virtio::DiskSpec;

/// Runs one input: the text of the value.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<DiskSpec>() {
        Ok(spec) => {
            assert!(!spec.path.as_os_str().is_empty(), "{text:?}");
            assert_eq!(spec.readonly, text.ends_with(",readonly"), "{text:?}");
            let path = spec.path.to_str().expect("parsed from a str");
            let rebuilt = if spec.readonly {
                format!("{path},readonly")
            } else {
                path.to_string()
            };
            assert_eq!(rebuilt, text);
        }
        Err(err) => {
            assert!(text.is_empty() || text == ",readonly", "{text:?}: {err}");
        }
    }
}
