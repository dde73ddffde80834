//! Opt-in timing of where a batched step spends its time (`LLAMA_BRANCH_PROFILE=1` prints one
//! line per commit/produce to stderr). Off by default; when off it costs one cached flag check.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("LLAMA_BRANCH_PROFILE").is_some_and(|v| v != "0"))
}

/// Named phases of one operation; repeated names accumulate.
pub struct Phases {
    what: &'static str,
    n: usize,
    start: Instant,
    last: Instant,
    parts: Vec<(&'static str, Duration)>,
}

impl Phases {
    /// `None` unless profiling is enabled, so callers pay nothing by default.
    pub fn start(what: &'static str, n: usize) -> Option<Phases> {
        enabled().then(|| {
            let now = Instant::now();
            Phases {
                what,
                n,
                start: now,
                last: now,
                parts: Vec::new(),
            }
        })
    }

    /// Attributes the time since the previous mark to `name`.
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        let d = now - self.last;
        self.last = now;
        match self.parts.iter_mut().find(|p| p.0 == name) {
            Some(p) => p.1 += d,
            None => self.parts.push((name, d)),
        }
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(k, d)| format!("{k} {:.3}", d.as_secs_f64() * 1e3))
            .collect();
        eprintln!(
            "[llama-branch profile] {} n={} total {:.3} ms: {}",
            self.what,
            self.n,
            self.start.elapsed().as_secs_f64() * 1e3,
            parts.join(", ")
        );
    }
}
