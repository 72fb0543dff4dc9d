//! `drill diff BASE NEW [--markdown] [--fail-on MARGINS]`: what changed between two runs'
//! reports ([`crate::diff`]); exit 1 on a regression beyond the margins, 2 on bad input.

use std::path::PathBuf;

use crate::diff;

use super::{FAIL, INVALID, PASS};

#[derive(clap::Args)]
pub struct Flags {
    /// The base: a report.json, a drill's report folder, or a folder of them (`--out DIR`).
    pub base: PathBuf,
    /// The new run, likewise.
    pub new: PathBuf,
    /// Print markdown (a pull request comment, a job summary) instead of a table.
    #[arg(long)]
    pub markdown: bool,
    /// Exit 1 when a change is beyond a margin, e.g. recovery+20%,drain+20%,duplicates+0
    /// (metrics: verdict, lost, duplicates, reordered, recovery, drain, throughput-N%).
    /// Without it, the diff only reports.
    #[arg(long)]
    pub fail_on: Option<String>,
}

pub fn run(flags: Flags) -> u8 {
    let margins = match flags.fail_on.as_deref().map(diff::parse_margins) {
        None => Vec::new(),
        Some(Ok(m)) => m,
        Some(Err(e)) => {
            eprintln!("drill diff: --fail-on {e}");
            return INVALID;
        }
    };
    let (base, new) = match (diff::load(&flags.base), diff::load(&flags.new)) {
        (Ok(b), Ok(n)) => (b, n),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("drill diff: {e}");
            return INVALID;
        }
    };
    let d = diff::compare(&base, &new, &margins);
    if d.drills.is_empty() {
        eprintln!(
            "drill diff: no drill is in both {} and {} (base has {}; new has {})",
            flags.base.display(),
            flags.new.display(),
            base.keys().cloned().collect::<Vec<_>>().join(", "),
            new.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        return INVALID;
    }
    if flags.markdown {
        print!("{}", diff::markdown(&d));
    } else {
        print!("{}", diff::table(&d));
    }
    if d.regressions().is_empty() {
        PASS
    } else {
        FAIL
    }
}
