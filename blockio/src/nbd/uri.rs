//! NBD URIs, as the NBD project specifies them (`doc/uri.md` there):
//! `nbd://HOST[:PORT]/EXPORT` over TCP and `nbd+unix:///EXPORT?socket=PATH`
//! over a Unix socket, and their TLS forms `nbds://` and `nbds+unix://`,
//! whose query names the certificates (`tls-certificates=DIR`), the name
//! the server's certificate must carry (`tls-hostname=NAME`) and, for tests
//! only, `tls-verify-peer=false`. TLS-PSK (`tls-psk-file=`) is refused with
//! a message: rustls implements no external pre-shared keys.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::str::FromStr;

/// The IANA-assigned NBD port, used when the URI names none.
pub const DEFAULT_PORT: u16 = 10809;

/// The forms an NBD URI can take, for error messages.
pub const NBD_URI_FORMS: &str =
    "nbd://HOST[:PORT]/EXPORT (TCP, port 10809 by default) or nbd+unix:///EXPORT?socket=PATH (Unix socket), with TLS nbds://HOST[:PORT]/EXPORT[?tls-certificates=DIR][&tls-hostname=NAME] or nbds+unix:///EXPORT?socket=PATH&tls-hostname=NAME[&tls-certificates=DIR]";

/// The file of trusted certificate authorities used when an `nbds://` URI
/// names no `tls-certificates=` directory: Debian's system bundle.
pub const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// TLS settings of an `nbds://` or `nbds+unix://` URI.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NbdTls {
    /// `tls-certificates=DIR`: a directory laid out as nbdkit, qemu-nbd and
    /// libnbd expect, `ca-cert.pem` (the authorities trusted to sign the
    /// server's certificate) and optionally `client-cert.pem` with
    /// `client-key.pem` (this client's own, for servers that ask).
    /// `None`: the system's authorities ([`SYSTEM_CA_FILE`]), no client
    /// certificate.
    pub certificates_dir: Option<PathBuf>,
    /// `tls-hostname=NAME`: the name (or address) the server's certificate
    /// must be issued to; `None` is the URI's host.
    pub hostname: Option<String>,
    /// `tls-verify-peer=false` clears it: any certificate is accepted. The
    /// traffic is still encrypted, but anyone on the path can pose as the
    /// server; for tests with throwaway certificates only.
    pub verify_peer: bool,
}

/// Where an NBD server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdAddress {
    /// TCP: a host name or address literal (IPv6 without brackets) and port.
    Tcp {
        /// Host name or address.
        host: String,
        /// TCP port.
        port: u16,
    },
    /// A Unix domain socket.
    Unix {
        /// The socket's path.
        socket: PathBuf,
    },
}

/// A parsed NBD URI: the server and the export's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    /// The server.
    pub address: NbdAddress,
    /// The export name (percent-decoded; empty is the server's default).
    pub export: String,
    /// TLS, for the `nbds` schemes (`None`: in the clear).
    pub tls: Option<NbdTls>,
}

/// Why an NBD URI was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid NBD URI {uri:?}: {reason}; expected {NBD_URI_FORMS}")]
pub struct NbdUriError {
    /// The text given.
    pub uri: String,
    /// What is wrong with it.
    pub reason: String,
}

impl NbdUri {
    /// Whether `text` is meant as an NBD URI (its scheme starts `nbd`), so
    /// that callers accepting paths too can tell which parser to use and a
    /// malformed NBD URI gets the NBD error rather than "no such file".
    pub fn looks_like(text: &str) -> bool {
        text.split_once("://")
            .is_some_and(|(scheme, _)| scheme.starts_with("nbd"))
    }

    /// Whether this URI's traffic crosses a network in the clear: TCP
    /// without TLS to a host other than `localhost` or a loopback address.
    /// (A name is judged as written: one that resolves to a loopback
    /// address still counts as remote, which errs toward the warning.)
    pub fn in_the_clear_over_a_network(&self) -> bool {
        match (&self.address, &self.tls) {
            (NbdAddress::Tcp { host, .. }, None) => {
                let loopback = host == "localhost"
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback());
                !loopback
            }
            _ => false,
        }
    }

    /// The socket addresses to try, resolved now. Resolution opens files
    /// (`/etc/hosts`, `/etc/resolv.conf`), which no thread may do once the
    /// VM runs under seccomp, so the client resolves once at open and
    /// reconnects to what it found then. (Empty for a Unix socket.)
    pub fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        match &self.address {
            NbdAddress::Tcp { host, port } => {
                Ok((host.as_str(), *port).to_socket_addrs()?.collect())
            }
            NbdAddress::Unix { .. } => Ok(Vec::new()),
        }
    }
}

impl FromStr for NbdUri {
    type Err = NbdUriError;

    fn from_str(text: &str) -> Result<Self, NbdUriError> {
        let fail = |reason: &str| NbdUriError {
            uri: text.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| fail("no scheme (nbd:// or nbd+unix://)"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        if rest.contains('#') || query.is_some_and(|q| q.contains('#')) {
            return Err(fail("a fragment (#...) has no meaning here"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).map_err(|r| fail(&r))?;
        let (unix, tls) = match scheme {
            "nbd" => (false, false),
            "nbd+unix" => (true, false),
            "nbds" => (false, true),
            "nbds+unix" => (true, true),
            other => {
                return Err(fail(&format!(
                    "unknown scheme {other:?} (nbd+vsock and others are not supported)"
                )))
            }
        };
        let mut socket = None;
        let mut tls_settings = NbdTls {
            verify_peer: true,
            ..NbdTls::default()
        };
        let mut tls_named = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let decoded = |value: &str| percent_decode(value).map_err(|r| fail(&r));
            match pair.split_once('=') {
                Some(("socket", value)) if !value.is_empty() => {
                    socket = Some(PathBuf::from(decoded(value)?))
                }
                Some(("tls-certificates", value)) if !value.is_empty() => {
                    tls_named = Some("tls-certificates");
                    tls_settings.certificates_dir = Some(PathBuf::from(decoded(value)?));
                }
                Some(("tls-hostname", value)) if !value.is_empty() => {
                    tls_named = Some("tls-hostname");
                    tls_settings.hostname = Some(decoded(value)?);
                }
                Some(("tls-verify-peer", value)) => {
                    tls_named = Some("tls-verify-peer");
                    tls_settings.verify_peer = match value {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        v => {
                            return Err(fail(&format!(
                                "tls-verify-peer={v:?}: expected true or false"
                            )))
                        }
                    };
                }
                Some(("tls-psk-file" | "tls-username", _)) => {
                    return Err(fail(
                        "TLS with a pre-shared key is not supported (rustls implements none); give the server an X.509 certificate and name its CA with tls-certificates=DIR",
                    ))
                }
                _ => {
                    return Err(fail(&format!(
                        "unknown query parameter {pair:?} (known: socket=PATH with the +unix schemes; tls-certificates=DIR, tls-hostname=NAME, tls-verify-peer=false with nbds)"
                    )))
                }
            }
        }
        if let (Some(name), false) = (tls_named, tls) {
            return Err(fail(&format!(
                "{name}= asks for TLS, which is the nbds:// (or nbds+unix://) scheme, not {scheme}://"
            )));
        }
        let address = if unix {
            if !authority.is_empty() {
                return Err(fail(&format!(
                    "{scheme}:// takes no host: write three slashes, {scheme}:///EXPORT?socket=PATH"
                )));
            }
            let socket = socket.ok_or_else(|| {
                fail(&format!(
                    "{scheme}:// needs ?socket=PATH naming the server's Unix socket"
                ))
            })?;
            if tls && tls_settings.verify_peer && tls_settings.hostname.is_none() {
                return Err(fail(
                    "nbds+unix:// needs tls-hostname=NAME, the name on the server's certificate (a Unix socket has no host to check it against)",
                ));
            }
            NbdAddress::Unix { socket }
        } else {
            if socket.is_some() {
                return Err(fail(&format!(
                    "socket= belongs to {scheme}+unix://, not {scheme}://"
                )));
            }
            if authority.is_empty() {
                return Err(fail(&format!(
                    "{scheme}:// needs a host, e.g. {scheme}://127.0.0.1/EXPORT"
                )));
            }
            let (host, port) = split_host_port(authority).map_err(|r| fail(&r))?;
            NbdAddress::Tcp { host, port }
        };
        Ok(NbdUri {
            address,
            export,
            tls: tls.then_some(tls_settings),
        })
    }
}

/// `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`.
fn split_host_port(authority: &str) -> Result<(String, u16), String> {
    if authority.contains('@') {
        return Err("user names (user@host) are not supported".into());
    }
    let (host, port) =
        if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| "an IPv6 address needs its closing ]".to_string())?;
            match after {
                "" => (host, None),
                p => (
                    host,
                    Some(p.strip_prefix(':').ok_or_else(|| {
                        format!("expected :PORT after the IPv6 address, got {p:?}")
                    })?),
                ),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, Some(p)),
                Some(_) => {
                    return Err("an IPv6 address goes in brackets, e.g. nbd://[::1]/EXPORT".into())
                }
                None => (authority, None),
            }
        };
    if host.is_empty() {
        return Err("empty host".into());
    }
    // Checked here, not left to name resolution: a host the URI printed
    // back cannot express (brackets, slashes, spaces) must be refused when
    // parsed, and an address literal in brackets must be one.
    if authority.starts_with('[') {
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{host:?} in brackets is not an IPv6 address"));
        }
    } else if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    {
        return Err(format!(
            "bad host {host:?}: a host name (letters, digits, '.', '-', '_'), an IPv4 address or [IPv6]"
        ));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("bad port {p:?}, expected 1 to 65535"))?,
    };
    Ok((host.to_string(), port))
}

/// `%XX` escapes decoded; the result must be UTF-8 (NBD export names are).
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape at byte {i}, expected %XX"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the decoded export name is not UTF-8".into())
}

/// `text` with the characters a URI path or query cannot hold escaped.
fn percent_encode(text: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            write!(f, "{}", b as char)?;
        } else {
            write!(f, "%{b:02X}")?;
        }
    }
    Ok(())
}

impl fmt::Display for NbdUri {
    /// The URI in the form it parses from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.tls.is_some() { "s" } else { "" };
        let mut separator = '?';
        match &self.address {
            NbdAddress::Tcp { host, port } => {
                if host.contains(':') {
                    write!(f, "nbd{s}://[{host}]")?;
                } else {
                    write!(f, "nbd{s}://{host}")?;
                }
                if *port != DEFAULT_PORT {
                    write!(f, ":{port}")?;
                }
                f.write_str("/")?;
                percent_encode(&self.export, f)?;
            }
            NbdAddress::Unix { socket } => {
                write!(f, "nbd{s}+unix:///")?;
                percent_encode(&self.export, f)?;
                f.write_str("?socket=")?;
                percent_encode(&socket.to_string_lossy(), f)?;
                separator = '&';
            }
        }
        if let Some(tls) = &self.tls {
            let mut param = |f: &mut fmt::Formatter<'_>, name: &str| {
                let written = write!(f, "{separator}{name}=");
                separator = '&';
                written
            };
            if let Some(dir) = &tls.certificates_dir {
                param(f, "tls-certificates")?;
                percent_encode(&dir.to_string_lossy(), f)?;
            }
            if let Some(name) = &tls.hostname {
                param(f, "tls-hostname")?;
                percent_encode(name, f)?;
            }
            if !tls.verify_peer {
                param(f, "tls-verify-peer")?;
                f.write_str("false")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> NbdUri {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn tcp_forms() {
        assert_eq!(
            parse("nbd://127.0.0.1/swap"),
            NbdUri {
                address: NbdAddress::Tcp {
                    host: "127.0.0.1".into(),
                    port: DEFAULT_PORT
                },
                export: "swap".into(),
                tls: None,
            }
        );
        let u = parse("nbd://storage.example:10900/vol%20a");
        assert_eq!(
            u.address,
            NbdAddress::Tcp {
                host: "storage.example".into(),
                port: 10900
            }
        );
        assert_eq!(u.export, "vol a");
        let u = parse("nbd://[::1]:1234/");
        assert_eq!(
            u.address,
            NbdAddress::Tcp {
                host: "::1".into(),
                port: 1234
            }
        );
        assert_eq!(u.export, "");
        assert_eq!(parse("nbd://host").export, "");
    }

    #[test]
    fn unix_form() {
        let u = parse("nbd+unix:///disk?socket=/run/nbd.sock");
        assert_eq!(
            u.address,
            NbdAddress::Unix {
                socket: "/run/nbd.sock".into()
            }
        );
        assert_eq!(u.export, "disk");
        assert_eq!(parse("nbd+unix://?socket=/s").export, "");
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "nbd://127.0.0.1/swap",
            "nbd://h:99/a%20b",
            "nbd://[::1]/x",
            "nbd+unix:///disk?socket=/run/nbd.sock",
            "nbds://h/x",
            "nbds://h:99/x?tls-certificates=/etc/pki/a%20b&tls-hostname=store.example",
            "nbds://[::1]/x?tls-verify-peer=false",
            "nbds+unix:///x?socket=/s&tls-hostname=localhost",
            "nbds+unix:///x?socket=/s&tls-certificates=/c&tls-verify-peer=false",
        ] {
            assert_eq!(parse(s).to_string(), s);
            assert_eq!(parse(&parse(s).to_string()), parse(s));
        }
    }

    #[test]
    fn malformed_uris_say_what_is_expected() {
        for (bad, why) in [
            ("127.0.0.1/swap", "no scheme"),
            ("nbd:///swap", "needs a host"),
            ("nbd://h:0/x", "bad port"),
            ("nbd://h:99999/x", "bad port"),
            ("nbd://h:port/x", "bad port"),
            ("nbd://::1/x", "brackets"),
            ("nbd://[::1/x", "closing ]"),
            ("nbd+unix:///x", "needs ?socket=PATH"),
            ("nbd+unix://host/x?socket=/s", "takes no host"),
            // Found by the store_spec fuzz target: accepted, then printed
            // back as a URI that does not parse.
            ("nbd://[[[]/:n", "is not an IPv6 address"),
            ("nbd://ho st/x", "bad host"),
            ("nbd://a%20b/x", "bad host"),
            ("nbd://h/x?socket=/s", "belongs to nbd+unix"),
            ("nbd://h/x?foo=1", "unknown query parameter"),
            ("nbd://h/x?tls-certificates=/c", "nbds://"),
            ("nbd+unix:///x?socket=/s&tls-hostname=h", "nbds://"),
            ("nbds://h/x?tls-psk-file=/k", "pre-shared key"),
            ("nbds://h/x?tls-verify-peer=maybe", "true or false"),
            ("nbds+unix:///x?socket=/s", "tls-hostname=NAME"),
            ("nbds:///x", "needs a host"),
            ("nbd+vsock:///x", "unknown scheme"),
            ("nbd://h/%zz", "percent escape"),
            ("nbd://u@h/x", "user names"),
        ] {
            let err = bad.parse::<NbdUri>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
            assert!(
                err.contains("nbd+unix:///EXPORT?socket=PATH"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn only_plain_tcp_beyond_loopback_is_in_the_clear_over_a_network() {
        for (uri, clear) in [
            ("nbd://10.0.0.2/x", true),
            ("nbd://storage.example/x", true),
            ("nbd://[2001:db8::1]/x", true),
            ("nbd://127.0.0.1/x", false),
            ("nbd://127.1.2.3/x", false),
            ("nbd://[::1]/x", false),
            ("nbd://localhost/x", false),
            ("nbd+unix:///x?socket=/s", false),
            ("nbds://10.0.0.2/x", false),
        ] {
            assert_eq!(parse(uri).in_the_clear_over_a_network(), clear, "{uri}");
        }
    }

    #[test]
    fn tls_settings() {
        let u = parse("nbds://10.0.0.2:10900/swap?tls-certificates=/etc/pki/nbd");
        assert_eq!(
            u.tls,
            Some(NbdTls {
                certificates_dir: Some("/etc/pki/nbd".into()),
                hostname: None,
                verify_peer: true,
            })
        );
        assert_eq!(parse("nbd://h/x").tls, None);
        let u = parse("nbds+unix:///x?socket=/s&tls-verify-peer=false");
        assert!(!u.tls.expect("TLS").verify_peer);
    }

    #[test]
    fn looks_like_tells_uris_from_paths() {
        assert!(NbdUri::looks_like("nbd://h/x"));
        assert!(NbdUri::looks_like("nbds://h/x"));
        assert!(NbdUri::looks_like("nbd+unix:///x?socket=/s"));
        assert!(!NbdUri::looks_like("/var/tmp/nbd://x"));
        assert!(!NbdUri::looks_like("disk.img"));
    }
}
