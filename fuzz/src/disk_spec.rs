//! The `--disk PATH[,readonly]` value (`devices::virtio::DiskSpec`), its
//! NBD form (`nbd://...[,readonly][,timeout=SECONDS]`) and its vhost-user
//! form (`vhost-user-blk:SOCKET[,readonly][,timeout=SECONDS]`).

use blockio::nbd::NbdUri;
use devices::virtio::DiskSpec;

/// Runs one input: the text of the value.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let nbd = NbdUri::looks_like(text);
    let vhost_user = !nbd && text.starts_with("vhost-user-blk:");
    match text.parse::<DiskSpec>() {
        Ok(spec) if nbd || vhost_user => {
            // An NBD or vhost-user disk prints back in a form that parses
            // to the same spec.
            assert_eq!(spec.nbd.is_some(), nbd, "{text:?}");
            assert_eq!(spec.vhost_user.is_some(), vhost_user, "{text:?}");
            let printed = spec.to_string();
            let again: DiskSpec = printed
                .parse()
                .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}: {e}"));
            assert_eq!(again, spec, "{text:?} printed as {printed:?}");
        }
        Ok(spec) => {
            assert!(spec.nbd.is_none(), "{text:?}");
            assert!(spec.vhost_user.is_none(), "{text:?}");
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
            let text_err = err.to_string();
            assert!(
                nbd || vhost_user || text.is_empty() || text == ",readonly",
                "{text:?}: {text_err}"
            );
        }
    }
}
