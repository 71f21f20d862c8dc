//! Unit tests of `oomshim_cli::args` (src/cli/args.rs).

use clap::CommandFactory;
use oomshim_cli::args::Args;

/// Every argument of every subcommand has help text, and every subcommand an example.
#[test]
fn help_describes_every_argument_and_shows_an_example() {
    let cmd = Args::command();
    cmd.clone().debug_assert();
    for sub in cmd.get_subcommands() {
        let after = sub
            .get_after_help()
            .map(|s| s.to_string())
            .unwrap_or_default();
        assert!(
            after.contains("Example"),
            "{} has no example",
            sub.get_name()
        );
        assert!(sub.get_about().is_some(), "{} has no about", sub.get_name());
        for arg in sub.get_arguments() {
            if matches!(arg.get_id().as_str(), "help" | "version") {
                continue;
            }
            assert!(
                arg.get_help()
                    .is_some_and(|h| !h.to_string().trim().is_empty()),
                "{} {} has no help",
                sub.get_name(),
                arg.get_id()
            );
        }
    }
}
