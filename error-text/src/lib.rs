//! An error and its causes on one line, as the binaries print it at their
//! edge (`hugevmm: error: ...`). A crate of its own because both binaries
//! (`hugevmm` and `hugevmm-bench`) need the same line and neither links
//! the other.

#![deny(missing_docs)]

/// `e` and its causes on one line, each cause once. Many errors already
/// say their cause (thiserror's `{source}` in the message), which `{:#}`
/// would print a second time ("... (os error 2); check that it exists
/// ...: No such file or directory (os error 2)"); a cause whose text the
/// line holds already is left out.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_said_once_in_order() {
        let io = std::io::Error::from_raw_os_error(2);
        let io_text = io.to_string();
        // A cause the message already holds is left out ...
        let said = anyhow::Error::new(io).context(format!("cannot open x: {io_text}"));
        assert_eq!(one_line(&said), format!("cannot open x: {io_text}"));
        // ... one it does not is appended after ": ", outermost first.
        let unsaid = anyhow::anyhow!("disk full")
            .context("cannot write the store")
            .context("eviction failed");
        assert_eq!(
            one_line(&unsaid),
            "eviction failed: cannot write the store: disk full"
        );
    }

    /// The binaries' own error style: a thiserror message that says its
    /// `source`, and anyhow context around an io::Error.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot open x: {source}; check that it exists")]
    struct SaysItsCause {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_says_already_is_not_repeated() {
        let e = anyhow::Error::new(SaysItsCause {
            source: std::io::Error::from_raw_os_error(2),
        });
        assert_eq!(
            one_line(&e),
            "cannot open x: No such file or directory (os error 2); check that it exists"
        );
        // Causes the message does not say are kept, in order.
        let e = anyhow::Error::new(std::io::Error::from_raw_os_error(13))
            .context("reading the key")
            .context("invalid --swap-key-file");
        assert_eq!(
            one_line(&e),
            "invalid --swap-key-file: reading the key: Permission denied (os error 13)"
        );
    }
}
