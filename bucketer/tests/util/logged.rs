//! What a test's code logs, captured.
//!
//! One global subscriber writes each event into the buffer of the thread that logs it, when
//! that thread is capturing: a subscriber set for a scope (`with_default`) missed events in
//! tests run side by side, their call sites' interest cached while no scope had one.

use std::cell::RefCell;
use std::str::FromStr;

thread_local! {
    static LINES: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Writes into the logging thread's buffer, if it has one.
struct ThreadBuffer;

impl std::io::Write for ThreadBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LINES.with(|l| l.borrow_mut().as_mut().map(|v| v.extend_from_slice(buf)));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f`, with the lines it logs (on this thread) at `level` and above, INFO at most
/// (without colours, times or the level's padding).
pub(crate) fn logged<T>(level: tracing::Level, f: impl FnOnce() -> T) -> (T, Vec<String>) {
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .without_time()
            .with_writer(|| ThreadBuffer)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
    });
    LINES.with(|l| *l.borrow_mut() = Some(Vec::new()));
    let out = f();
    let bytes = LINES.with(|l| l.borrow_mut().take()).unwrap_or_default();
    let text = String::from_utf8(bytes).unwrap();
    let at_level = |line: &&str| {
        let word = line.split_whitespace().next().unwrap_or_default();
        tracing::Level::from_str(word).is_ok_and(|l| l <= level)
    };
    (out, text.lines().map(str::trim_start).filter(at_level).map(str::to_string).collect())
}
