//! Reads /proc/self/smaps to tell how much of a range is mapped huge.

/// Sums `AnonHugePages` and `Rss` (bytes) over the VMAs that overlap
/// `[start, start+len)`. Exact when the range is its own VMA (registering a
/// range with userfaultfd or madvising it splits the VMA at its edges).
pub fn huge_and_rss_bytes(start: u64, len: u64) -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let end = start + len;
    let (mut huge, mut rss) = (0u64, 0u64);
    let mut inside = false;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                inside = a < end && b > start;
                continue;
            }
        }
        if !inside {
            continue;
        }
        let kib = |l: &str| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        if line.starts_with("AnonHugePages:") {
            huge += kib(line);
        } else if line.starts_with("Rss:") {
            rss += kib(line);
        }
    }
    (huge, rss)
}
