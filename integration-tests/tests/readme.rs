//! README.md's shell blocks run as written, and the outputs it shows are
//! the outputs hugevmm prints.
//!
//! Every ```` ```sh ```` block in README.md is preceded by a directive
//! comment that says how this test treats it; a block without one fails
//! the test, so a new example cannot go untested by accident:
//!
//! - `<!-- readme-test: run [in=repo] [status=N|N|...] [timeout=SECONDS]
//!   [removes=FILE,...] -->`: run the block with `bash -euo pipefail` in a
//!   scratch directory holding links to the repository's `.ci`, `tools`,
//!   `payloads` and `target` (or, with `in=repo`, in the repository, which
//!   the block needs for `cargo`; `removes=` names what it leaves there),
//!   with the `hugevmm` this test run built first on `PATH`, as the
//!   README's PATH line puts it; it must end with one of the statuses
//!   (default 0) within the timeout (default 300 s);
//! - `<!-- readme-test: run-beside "COMMAND" ready=PATH [...] -->`: the
//!   same, with COMMAND started in the background first (the VM a block
//!   talks to "from another terminal") and PATH waited for; COMMAND is
//!   ended with SIGTERM afterwards and must end cleanly;
//! - `<!-- readme-test: not-run REASON -->`: not run here; REASON says
//!   where it runs instead (a CI step, or a long benchmark run by hand);
//! - `<!-- readme-test: file NAME -->` before a ```` ```json ```` block:
//!   the block is written to NAME in the scratch directory, for the
//!   blocks after it;
//! - `<!-- readme-test: output -->` before a plain ```` ``` ```` block:
//!   every line of it must be a line the previous run block printed, with
//!   each number allowed to differ (and runs of spaces).
//!
//! Blocks run in README order in one scratch directory, so a file one
//! block makes (`disk.img`, `initrd.img`) is there for the next.

use integration_tests::*;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// One fenced block of README.md and the directive before it.
#[derive(Debug)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    lang: String,
    body: String,
    directive: Option<Directive>,
}

#[derive(Debug, PartialEq)]
enum Directive {
    Run(RunSpec),
    NotRun(String),
    File(String),
    Output,
}

#[derive(Debug, Default, PartialEq)]
struct RunSpec {
    in_repo: bool,
    statuses: Vec<i32>,
    timeout_s: u64,
    removes: Vec<String>,
    beside: Option<(String, String)>,
}

/// Splits `text` into words, a double-quoted string being one word.
fn words(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut word = String::new();
        if c == '"' {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some(c) => word.push(c),
                    None => return Err(format!("unterminated quote in {text:?}")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                word.push(c);
                chars.next();
            }
        }
        out.push(word);
    }
    Ok(out)
}

fn parse_directive(text: &str) -> Result<Directive, String> {
    let (kind, rest) = text.split_once(' ').unwrap_or((text, ""));
    match kind {
        "not-run" => {
            let reason = rest.trim();
            if reason.len() < 20 {
                return Err(format!(
                    "not-run needs a reason saying where the block runs instead, got {reason:?}"
                ));
            }
            Ok(Directive::NotRun(reason.to_string()))
        }
        "file" => Ok(Directive::File(rest.trim().to_string())),
        "output" => Ok(Directive::Output),
        "run" | "run-beside" => {
            let mut words = words(rest)?.into_iter();
            let mut spec = RunSpec {
                statuses: vec![0],
                timeout_s: 300,
                ..RunSpec::default()
            };
            let mut ready = None;
            let command = if kind == "run-beside" {
                Some(words.next().ok_or("run-beside needs a command")?)
            } else {
                None
            };
            for word in words {
                let (key, value) = word
                    .split_once('=')
                    .ok_or_else(|| format!("expected key=value, got {word:?}"))?;
                match key {
                    "in" if value == "repo" => spec.in_repo = true,
                    "status" => {
                        spec.statuses = value
                            .split('|')
                            .map(|s| s.parse().map_err(|_| format!("bad status {s:?}")))
                            .collect::<Result<_, _>>()?
                    }
                    "timeout" => {
                        spec.timeout_s = value
                            .parse()
                            .map_err(|_| format!("bad timeout {value:?}"))?
                    }
                    "removes" => spec.removes = value.split(',').map(String::from).collect(),
                    "ready" => ready = Some(value.to_string()),
                    _ => return Err(format!("unknown option {word:?}")),
                }
            }
            if let Some(command) = command {
                let ready = ready.ok_or("run-beside needs ready=PATH")?;
                spec.beside = Some((command, ready));
            }
            Ok(Directive::Run(spec))
        }
        _ => Err(format!("unknown directive {kind:?}")),
    }
}

/// The fenced blocks of a Markdown text, each with the directive on the
/// nearest non-blank line before it, if that line is one.
fn blocks(markdown: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let mut body = String::new();
        i += 1;
        while i < lines.len() && lines[i].trim_end() != "```" {
            body.push_str(lines[i]);
            body.push('\n');
            i += 1;
        }
        if i == lines.len() {
            return Err(format!("README.md:{}: unclosed fence", start + 1));
        }
        i += 1;
        let before = lines[..start].iter().rev().find(|l| !l.trim().is_empty());
        let directive = before
            .and_then(|l| l.trim().strip_prefix("<!-- readme-test:"))
            .and_then(|l| l.strip_suffix("-->"))
            .map(|d| parse_directive(d.trim()))
            .transpose()
            .map_err(|e| format!("README.md:{}: {e}", start + 1))?;
        out.push(Block {
            line: start + 1,
            lang: lang.trim().to_string(),
            body,
            directive,
        });
    }
    Ok(out)
}

/// A line with every number (digits, with a fraction) as `#` and runs of
/// blanks as one space: what an output line shown in the README must
/// share with the printed one.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            while chars
                .peek()
                .is_some_and(|&d| d.is_ascii_digit() || d == '.' || d == ',')
            {
                chars.next();
            }
            out.push('#');
        } else if c.is_whitespace() {
            while chars.peek().is_some_and(|d| d.is_whitespace()) {
                chars.next();
            }
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// The README's lines that the printed text lacks (by shape).
fn missing_lines(shown: &str, printed: &str) -> Vec<String> {
    let printed: Vec<String> = printed.lines().map(shape).collect();
    shown
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !printed.contains(&shape(l)))
        .map(String::from)
        .collect()
}

/// A scratch directory that looks like a checkout to the README's
/// commands: links to what they use of the repository.
fn scratch_dir() -> PathBuf {
    let dir = temp_path("readme");
    std::fs::create_dir_all(&dir).unwrap();
    for name in [".ci", "tools", "payloads", "target"] {
        std::os::unix::fs::symlink(repo().join(name), dir.join(name)).unwrap();
    }
    dir
}

/// `bash -euo pipefail -c SCRIPT` in `dir`, in a process group of its own
/// so that whatever it starts is ended with it. `TMPDIR` is `temp`, a
/// folder of the test's own: what the commands leave there by design
/// (`hugevmm host`'s default state folder) goes with the test's files.
fn spawn_script(script: &str, dir: &Path, temp: &Path, path_var: &str) -> Child {
    std::fs::create_dir_all(temp).expect("a TMPDIR for the README's commands");
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path_var)
        .env("TMPDIR", temp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn bash")
}

fn kill_group(child: &Child, signo: i32) {
    // SAFETY: kill has no memory effects; the group is our own child's,
    // which has not been waited for.
    unsafe { libc::kill(-(child.id() as libc::pid_t), signo) };
}

/// Waits for `child` at most `limit`; on timeout the group is killed and
/// the status is None.
fn wait_output(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if start.elapsed() > limit {
            kill_group(&child, libc::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The group's other members may hold the pipes open: end them too.
    kill_group(&child, libc::SIGKILL);
    let text = format!(
        "--- stdout\n{}\n--- stderr\n{}",
        out_reader.join().unwrap(),
        err_reader.join().unwrap()
    );
    (status, text)
}

#[test]
fn every_shell_block_has_a_directive_and_the_directives_parse() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = blocks(&readme).unwrap_or_else(|e| panic!("{e}"));
    let mut shell = 0;
    for block in &blocks {
        if block.lang == "sh" {
            shell += 1;
            match &block.directive {
                Some(Directive::Run(_) | Directive::NotRun(_)) => {}
                other => panic!(
                    "README.md:{}: a shell block needs `<!-- readme-test: run ... -->` or \
                     `<!-- readme-test: not-run REASON -->` before it, found {other:?}",
                    block.line
                ),
            }
        }
        if block.directive == Some(Directive::Output) {
            assert_eq!(
                block.lang, "",
                "README.md:{}: output blocks are plain",
                block.line
            );
        }
    }
    assert!(
        shell >= 5,
        "only {shell} shell blocks found: the parser is off"
    );
}

#[test]
fn the_output_matcher_tells_a_changed_message() {
    let printed = "hugevmm: verify exited 0 after 10.918 s on 4 vCPUs\nother\n";
    assert!(missing_lines("hugevmm: verify exited 0 after 9.1 s on 2 vCPUs", printed).is_empty());
    assert_eq!(
        missing_lines("hugevmm: verify ended after 9.1 s on 2 vCPUs", printed).len(),
        1
    );
}

#[test]
fn the_readme_s_shell_blocks_run_as_written() {
    if skip_without_kvm("the_readme_s_shell_blocks_run_as_written") {
        return;
    }
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = blocks(&readme).unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch_dir();
    let bin_dir = hugevmm_bin().parent().unwrap().to_path_buf();
    let path_var = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut last_output: Option<(usize, String)> = None;
    let mut failures = Vec::new();
    for block in &blocks {
        match &block.directive {
            Some(Directive::File(name)) => {
                std::fs::write(dir.join(name), &block.body).unwrap();
            }
            Some(Directive::Output) => {
                let Some((line, printed)) = &last_output else {
                    failures.push(format!(
                        "README.md:{}: output with no run before",
                        block.line
                    ));
                    continue;
                };
                let missing = missing_lines(&block.body, printed);
                if !missing.is_empty() {
                    failures.push(format!(
                        "README.md:{}: the output shown is not what the block at line {line} \
                         printed; these lines differ:\n{}\n{printed}",
                        block.line,
                        missing.join("\n")
                    ));
                }
            }
            Some(Directive::Run(spec)) => {
                let cwd = if spec.in_repo { repo() } else { dir.clone() };
                eprintln!("README.md:{}: running\n{}", block.line, block.body);
                let beside = spec.beside.as_ref().map(|(command, ready)| {
                    let ready = dir.join(ready);
                    // A socket left by a VM that was killed would look ready.
                    let _ = std::fs::remove_file(&ready);
                    let child = spawn_script(
                        &format!("exec {command}"),
                        &dir,
                        &dir.join("tmp"),
                        &path_var,
                    );
                    let start = Instant::now();
                    while !ready.exists() && start.elapsed() < Duration::from_secs(120) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    (child, ready)
                });
                let started = Instant::now();
                let child = spawn_script(&block.body, &cwd, &dir.join("tmp"), &path_var);
                let (status, text) = wait_output(child, Duration::from_secs(spec.timeout_s));
                eprintln!(
                    "README.md:{}: status {status:?} after {:.1} s",
                    block.line,
                    started.elapsed().as_secs_f64()
                );
                if let Some((child, _)) = beside {
                    kill_group(&child, libc::SIGTERM);
                    let (beside_status, beside_text) = wait_output(child, Duration::from_secs(60));
                    // Ended by the block itself (`quit`: 0) or by the
                    // SIGTERM above.
                    if ![Some(0), Some(128 + libc::SIGTERM)].contains(&beside_status) {
                        failures.push(format!(
                            "README.md:{}: the VM beside the block did not end cleanly on SIGTERM \
                             ({beside_status:?})\n{beside_text}",
                            block.line
                        ));
                    }
                }
                if !status.is_some_and(|s| spec.statuses.contains(&s)) {
                    failures.push(format!(
                        "README.md:{}: status {status:?} (None: killed after {} s), expected one of \
                         {:?}\n{}\n{text}",
                        block.line, spec.timeout_s, spec.statuses, block.body
                    ));
                }
                for name in &spec.removes {
                    let _ = std::fs::remove_file(cwd.join(name));
                }
                last_output = Some((block.line, text));
            }
            Some(Directive::NotRun(_)) | None => {}
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
