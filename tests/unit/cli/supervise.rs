//! Unit tests of `oomshim_cli::supervise` (src/cli/supervise.rs).

use oomshim_cli::supervise::*;

#[test]
fn terminal_own_and_descendant_signals_are_never_passed_on() {
    let none = |_| false;
    assert_eq!(rule(libc::SIGINT, libc::SI_KERNEL, 0, 10, none), Rule::Drop);
    assert_eq!(
        rule(libc::SIGWINCH, libc::SI_KERNEL, 0, 10, none),
        Rule::Drop
    );
    // An interval timer inherited across exec fires in oomshim: the program's.
    assert_eq!(
        rule(libc::SIGALRM, libc::SI_KERNEL, 0, 10, none),
        Rule::UnlessSentinelSawIt
    );
    assert_eq!(rule(libc::SIGPIPE, libc::SI_USER, 10, 10, none), Rule::Drop);
    assert_eq!(
        rule(libc::SIGTERM, libc::SI_USER, 11, 10, |p| p == 11),
        Rule::Drop
    );
    assert_eq!(
        rule(libc::SIGTERM, libc::SI_USER, 12, 10, |p| p == 11),
        Rule::UnlessSentinelSawIt
    );
    assert_eq!(
        rule(libc::SIGRTMIN() + 3, libc::SI_QUEUE, 12, 10, none),
        Rule::UnlessSentinelSawIt
    );
}

#[test]
fn every_catchable_signal_but_the_stops_and_the_ignored_ones_is_taken_in() {
    let c = caught_signals(bit(libc::SIGHUP) | bit(libc::SIGCHLD));
    assert_eq!(c & bit(libc::SIGHUP), 0, "ignored at start: stays ignored");
    assert_ne!(c & bit(libc::SIGCHLD), 0, "SIGCHLD is needed to reap");
    for s in [
        libc::SIGKILL,
        libc::SIGSTOP,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
    ] {
        assert_eq!(c & bit(s), 0, "{s}");
    }
    for s in [
        libc::SIGTERM,
        libc::SIGPROF,
        libc::SIGVTALRM,
        libc::SIGIO,
        libc::SIGSYS,
        libc::SIGRTMIN(),
        libc::SIGRTMAX(),
    ] {
        assert_ne!(c & bit(s), 0, "{s}");
    }
}
