//! `hugevmm ctl`'s words (the control socket's commands from before it
//! spoke HTTP, unchanged) and the API request each one stands for.

use guestmem::{parse_size, PAGE_BYTES};
use serde_json::json;

/// A parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `balloon SIZE`: set the balloon target.
    Balloon {
        /// The target in bytes, a multiple of 4 KiB (not yet checked
        /// against guest RAM: the parser does not know it).
        target_bytes: u64,
    },
    /// `balloon-stats`: the balloon's figures; asks the guest for fresh
    /// statistics.
    BalloonStats,
    /// `stats`: the run's figures so far.
    Stats,
    /// `mem-limit SIZE|none`: change the swap engine's memory limit.
    MemLimit {
        /// The new limit in bytes; None lifts it.
        limit_bytes: Option<u64>,
    },
    /// `pageout`: evict all guest RAM to the store now.
    Pageout,
    /// `quit`: end the VM (status 0), as the console's Ctrl-A x does.
    Quit,
    /// `help`: the commands.
    Help,
}

/// Every command with its arguments and what it does, for `help` and for
/// error messages.
pub const COMMANDS: [(&str, &str); 7] = [
    (
        "balloon SIZE",
        "set the balloon target (K/M/G suffixes, a multiple of 4K, at most the guest RAM; 0 deflates); replies with the target",
    ),
    (
        "balloon-stats",
        "balloon target, actual and inflated pages, the latest guest statistics; asks the guest for a fresh report",
    ),
    (
        "stats",
        "the run's figures so far: elapsed time, KVM mappings, swap engine counters, balloon",
    ),
    (
        "mem-limit SIZE|none",
        "change the cap on resident guest RAM (needs the swap engine: --mem-limit or --swap-store); lowering it evicts at once, none lifts it",
    ),
    (
        "pageout",
        "evict all guest RAM to the store now and wait for the writes (needs the swap engine); replies with what left memory and how long it took",
    ),
    (
        "quit",
        "end the VM now with status 0 (statistics are still written), as Ctrl-A x on the console does",
    ),
    ("help", "this list"),
];

/// Why a line is not a command. The messages say what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// Nothing but whitespace.
    #[error("empty command; commands: {}", command_list())]
    Empty,
    /// The first word names no command.
    #[error("unknown command '{word}'; commands: {}", command_list())]
    Unknown {
        /// The first word (shortened if it is long).
        word: String,
    },
    /// A command got the wrong number of words.
    #[error("'{command}' takes {expected}: {usage}")]
    Arguments {
        /// The command.
        command: &'static str,
        /// What it takes, e.g. "one size".
        expected: &'static str,
        /// Its usage line.
        usage: &'static str,
    },
    /// `balloon` with a size that does not parse.
    #[error(
        "bad size '{word}' for balloon ({reason}): give e.g. balloon 256M, balloon 0 to deflate"
    )]
    BadSize {
        /// The size word (shortened if it is long).
        word: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `mem-limit` with a size that does not parse.
    #[error(
        "bad size '{word}' for mem-limit ({reason}): give e.g. mem-limit 256M, or mem-limit none"
    )]
    BadLimit {
        /// The word as given (shortened if long).
        word: String,
        /// Why it does not parse.
        reason: String,
    },
    /// `balloon` with a size that is not whole 4 KiB pages.
    #[error("balloon {word}: {bytes} bytes is not a multiple of 4 KiB: give whole pages, e.g. balloon 256M")]
    NotWholePages {
        /// The size word.
        word: String,
        /// Its value.
        bytes: u64,
    },
}

fn command_list() -> String {
    COMMANDS
        .iter()
        .map(|(usage, _)| *usage)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Longest word echoed whole in an error reply.
const MAX_ECHO_CHARS: usize = 40;

/// Echoed words are cut so that an error reply stays one short line.
fn shorten(word: &str) -> String {
    if word.chars().count() <= MAX_ECHO_CHARS {
        return word.to_string();
    }
    let mut short: String = word.chars().take(MAX_ECHO_CHARS).collect();
    short.push_str("...");
    short
}

/// A size word, or the word (shortened) and why it is not a size.
fn parse_size_word(word: &str) -> Result<u64, (String, String)> {
    parse_size(word).map_err(|e| {
        // The parser's message quotes the whole word again.
        let reason = if word.len() > MAX_ECHO_CHARS {
            "too long to be a size".into()
        } else {
            e.to_string()
        };
        (shorten(word), reason)
    })
}

/// An API request: method, path and JSON body (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRequest {
    /// `GET` or `PUT`.
    pub method: &'static str,
    /// The route.
    pub path: &'static str,
    /// The JSON body of a `PUT`.
    pub body: Option<String>,
}

impl Command {
    /// The API request this command stands for; None for `help`, which
    /// `hugevmm ctl` answers itself.
    pub fn request(&self) -> Option<ApiRequest> {
        let get = |path| ApiRequest {
            method: "GET",
            path,
            body: None,
        };
        let put = |path, body: serde_json::Value| ApiRequest {
            method: "PUT",
            path,
            body: Some(body.to_string()),
        };
        Some(match self {
            Command::Balloon { target_bytes } => {
                put("/balloon", json!({ "target_bytes": target_bytes }))
            }
            Command::BalloonStats => get("/balloon"),
            Command::Stats => get("/stats"),
            Command::MemLimit { limit_bytes } => {
                put("/mem-limit", json!({ "mem_limit_bytes": limit_bytes }))
            }
            Command::Pageout => put("/actions", json!({ "action": "pageout" })),
            Command::Quit => put("/actions", json!({ "action": "quit" })),
            Command::Help => return None,
        })
    }
}

/// The command each word list stands for, with its HTTP request, for
/// `hugevmm ctl help`.
pub fn help() -> serde_json::Value {
    let http = [
        "PUT /balloon {\"target_bytes\": N}",
        "GET /balloon",
        "GET /stats",
        "PUT /mem-limit {\"mem_limit_bytes\": N|null}",
        "PUT /actions {\"action\": \"pageout\"}",
        "PUT /actions {\"action\": \"quit\"}",
        "(answered by hugevmm ctl itself)",
    ];
    json!({
        "commands": COMMANDS
            .iter()
            .zip(http)
            .map(|((usage, does), http)| json!({ "command": usage, "does": does, "http": http }))
            .collect::<Vec<_>>(),
    })
}

/// Parses a command given as words (`hugevmm ctl` passes its arguments).
pub fn parse_words(words: &[&str]) -> Result<Command, CommandError> {
    let Some((&first, rest)) = words.split_first() else {
        return Err(CommandError::Empty);
    };
    let no_arguments = |command: Command, name: &'static str| {
        if rest.is_empty() {
            Ok(command)
        } else {
            Err(CommandError::Arguments {
                command: name,
                expected: "no arguments",
                usage: name,
            })
        }
    };
    match first {
        "balloon" => {
            let [word] = rest else {
                return Err(CommandError::Arguments {
                    command: "balloon",
                    expected: "one size",
                    usage: "balloon SIZE (e.g. balloon 256M; balloon 0 deflates)",
                });
            };
            let target_bytes = parse_size_word(word)
                .map_err(|(word, reason)| CommandError::BadSize { word, reason })?;
            if target_bytes.checked_rem(PAGE_BYTES) != Some(0) {
                return Err(CommandError::NotWholePages {
                    word: shorten(word),
                    bytes: target_bytes,
                });
            }
            Ok(Command::Balloon { target_bytes })
        }
        "mem-limit" => {
            let [word] = rest else {
                return Err(CommandError::Arguments {
                    command: "mem-limit",
                    expected: "one size or none",
                    usage: "mem-limit SIZE|none (e.g. mem-limit 256M)",
                });
            };
            if *word == "none" {
                return Ok(Command::MemLimit { limit_bytes: None });
            }
            let limit_bytes = parse_size_word(word)
                .map_err(|(word, reason)| CommandError::BadLimit { word, reason })?;
            Ok(Command::MemLimit {
                limit_bytes: Some(limit_bytes),
            })
        }
        "balloon-stats" => no_arguments(Command::BalloonStats, "balloon-stats"),
        "stats" => no_arguments(Command::Stats, "stats"),
        "pageout" => no_arguments(Command::Pageout, "pageout"),
        "quit" => no_arguments(Command::Quit, "quit"),
        "help" => no_arguments(Command::Help, "help"),
        other => Err(CommandError::Unknown {
            word: shorten(other),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Command, CommandError> {
        parse_words(&line.split_whitespace().collect::<Vec<_>>())
    }

    #[test]
    fn commands_parse() {
        assert_eq!(
            parse("balloon 256M"),
            Ok(Command::Balloon {
                target_bytes: 256 << 20
            })
        );
        assert_eq!(
            parse("  balloon\t0 \r"),
            Ok(Command::Balloon { target_bytes: 0 })
        );
        assert_eq!(
            parse("balloon 4K"),
            Ok(Command::Balloon { target_bytes: 4096 })
        );
        assert_eq!(parse("balloon-stats"), Ok(Command::BalloonStats));
        assert_eq!(
            parse("mem-limit 64M"),
            Ok(Command::MemLimit {
                limit_bytes: Some(64 << 20)
            })
        );
        assert_eq!(
            parse("mem-limit none"),
            Ok(Command::MemLimit { limit_bytes: None })
        );
        assert!(matches!(
            parse("mem-limit lots"),
            Err(CommandError::BadLimit { .. })
        ));
        assert!(matches!(
            parse("mem-limit"),
            Err(CommandError::Arguments { .. })
        ));
        assert!(matches!(
            parse("mem-limit 1G 2G"),
            Err(CommandError::Arguments { .. })
        ));
        assert_eq!(parse("stats"), Ok(Command::Stats));
        assert_eq!(parse("pageout"), Ok(Command::Pageout));
        assert_eq!(parse("quit"), Ok(Command::Quit));
        assert!(matches!(
            parse("quit now"),
            Err(CommandError::Arguments { .. })
        ));
        assert_eq!(parse("help\r"), Ok(Command::Help));
        assert_eq!(parse_words(&["balloon", "1G"]), parse("balloon 1G"));
    }

    #[test]
    fn bad_input_says_what_is_accepted() {
        for line in ["", "   ", "\r"] {
            assert_eq!(parse(line), Err(CommandError::Empty), "{line:?}");
        }
        let err = parse("inflate 1G").unwrap_err();
        assert_eq!(
            err,
            CommandError::Unknown {
                word: "inflate".into()
            }
        );
        let message = err.to_string();
        for usage in ["balloon SIZE", "balloon-stats", "stats", "help"] {
            assert!(message.contains(usage), "{message}");
        }
        // Commands are case-sensitive, like the words of the help text.
        assert!(matches!(parse("STATS"), Err(CommandError::Unknown { .. })));
        assert!(matches!(
            parse("balloon"),
            Err(CommandError::Arguments {
                command: "balloon",
                ..
            })
        ));
        assert!(matches!(
            parse("balloon 1G 2G"),
            Err(CommandError::Arguments { .. })
        ));
        assert!(matches!(
            parse("stats now"),
            Err(CommandError::Arguments {
                command: "stats",
                ..
            })
        ));
        assert!(matches!(
            parse("help me"),
            Err(CommandError::Arguments { .. })
        ));
        assert!(matches!(
            parse("balloon-stats 1"),
            Err(CommandError::Arguments { .. })
        ));
    }

    #[test]
    fn bad_sizes_are_refused() {
        for word in ["lots", "-1M", "1Q", "1.5.5M", "M", "99999999999999999999G"] {
            let err = parse(&format!("balloon {word}")).unwrap_err();
            assert!(
                matches!(err, CommandError::BadSize { .. }),
                "{word}: {err:?}"
            );
            assert!(err.to_string().contains("balloon 256M"), "{err}");
        }
        let err = parse("balloon 4097").unwrap_err();
        assert_eq!(
            err,
            CommandError::NotWholePages {
                word: "4097".into(),
                bytes: 4097
            }
        );
        assert!(err.to_string().contains("multiple of 4 KiB"), "{err}");
        assert!(matches!(
            parse("balloon 1.5K"),
            Err(CommandError::NotWholePages { .. })
        ));
    }

    #[test]
    fn every_command_but_help_is_a_route() {
        let routes: Vec<(&str, &str)> = crate::control::api::ROUTES
            .iter()
            .map(|(m, p, _)| (*m, *p))
            .collect();
        for (usage, _) in COMMANDS {
            let words: Vec<&str> = usage
                .split_whitespace()
                .map(|w| match w {
                    "SIZE" => "64M",
                    "SIZE|none" => "none",
                    other => other,
                })
                .collect();
            let command = parse_words(&words).unwrap();
            match command.request() {
                Some(request) => {
                    assert!(routes.contains(&(request.method, request.path)), "{usage}");
                    if let Some(body) = &request.body {
                        let _: serde_json::Value = serde_json::from_str(body).unwrap();
                    }
                }
                None => assert_eq!(command, Command::Help),
            }
        }
        let request = parse("mem-limit 64M").unwrap().request().unwrap();
        assert_eq!(
            request.body.as_deref(),
            Some(r#"{"mem_limit_bytes":67108864}"#)
        );
        let request = parse("mem-limit none").unwrap().request().unwrap();
        assert_eq!(request.body.as_deref(), Some(r#"{"mem_limit_bytes":null}"#));
        assert_eq!(help()["commands"].as_array().unwrap().len(), COMMANDS.len());
    }
}
