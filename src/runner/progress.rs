//! What a person watching a drill sees: on a terminal, an indicatif bar (records accepted of
//! the workload, read back, the link's state and the next step with a countdown, then the
//! drain); in CI or when piped, plain lines. Never both: every line goes through [`say`], which
//! prints above the bar when there is one.

use std::io::IsTerminal;
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Bars only on a terminal, and never under `CI` (CI logs want plain lines).
pub fn bars_wanted() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("CI").is_none()
}

/// Starts a bar of `total` records when [`bars_wanted`].
pub fn start(total: u64) {
    if !bars_wanted() {
        return;
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} accepted  {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    if let Ok(mut b) = BAR.lock() {
        *b = Some(bar);
    }
}

/// Whether a bar is showing (then periodic status goes to [`update`], not to lines).
pub fn showing() -> bool {
    BAR.lock().map(|b| b.is_some()).unwrap_or(false)
}

/// The bar's position and message.
pub fn update(accepted: u64, message: String) {
    if let Ok(b) = BAR.lock()
        && let Some(bar) = b.as_ref()
    {
        bar.set_position(accepted);
        bar.set_message(message);
    }
}

/// The bar's message only.
pub fn message(message: String) {
    if let Ok(b) = BAR.lock()
        && let Some(bar) = b.as_ref()
    {
        bar.set_message(message);
    }
}

/// Removes the bar (the drill's own lines stay).
pub fn finish() {
    if let Ok(mut b) = BAR.lock()
        && let Some(bar) = b.take()
    {
        bar.finish_and_clear();
    }
}

/// One line for the person: above the bar, or plainly.
pub fn say(line: &str) {
    if let Ok(b) = BAR.lock()
        && let Some(bar) = b.as_ref()
    {
        bar.println(line);
        return;
    }
    println!("{line}");
}
