//! `proxima check`: validate topology files and print every problem with its line.

use std::process::ExitCode;

use crate::cli::CheckArgs;

/// Check every file; exit 0 if all are valid, 1 if any is not.
pub fn run(args: &CheckArgs) -> ExitCode {
    let mut ok = true;
    for path in &args.files {
        match proxima_discovery::load(path) {
            Ok(t) => println!(
                "{}: ok ({} services, {} endpoints, {} nodes)",
                path.display(),
                t.service_count(),
                t.endpoint_count(),
                t.nodes.len()
            ),
            Err(e) => {
                ok = false;
                if e.problems().is_empty() {
                    println!("{e}");
                }
                for problem in e.problems() {
                    println!("{problem}");
                }
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
