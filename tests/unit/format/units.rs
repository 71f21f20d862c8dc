//! Unit tests of `dump::units` (src/format/units.rs).

use dump::units::*;

#[test]
fn human_bytes_table() {
    let cases: &[(u64, &str)] = &[
        (0, "0 B"),
        (1, "1 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (1024 * 1024 + 512 * 1024, "1.50 MiB"),
        (2 << 30, "2.00 GiB"),
        (80 << 30, "80.00 GiB"),
        ((1 << 20) - 1, "1.00 MiB"),
        ((1 << 30) - 1, "1.00 GiB"),
        (1 << 40, "1.00 TiB"),
        (u64::MAX, "16.00 EiB"),
    ];
    for &(bytes, want) in cases {
        assert_eq!(human_bytes(bytes), want, "{bytes}");
    }
}

#[test]
fn thousands_table() {
    let cases: &[(u64, &str)] = &[
        (0, "0"),
        (999, "999"),
        (1000, "1,000"),
        (4812, "4,812"),
        (123_456, "123,456"),
        (2_147_483_648, "2,147,483,648"),
        (u64::MAX, "18,446,744,073,709,551,615"),
    ];
    for &(n, want) in cases {
        assert_eq!(thousands(n), want);
    }
}

#[test]
fn exact_and_percent() {
    assert_eq!(bytes_with_exact(512), "512 B");
    assert_eq!(bytes_with_exact(2 << 30), "2.00 GiB (2,147,483,648 bytes)");
    assert_eq!(percent(share(1, 3)), "33.3%");
    assert_eq!(percent(share(1, 0)), "n/a");
    assert_eq!(percent(Some(f64::NAN)), "n/a");
    assert_eq!(percent(share(u64::MAX, 1)), "1844674407370955161600.0%");
}

#[test]
fn ages() {
    assert_eq!(human_age(0.25), "250 ms");
    assert_eq!(human_age(12.34), "12.3 s");
    assert_eq!(human_age(270.0), "4.5 min");
    assert_eq!(human_age(7560.0), "2.1 h");
    assert_eq!(human_age(3.0 * 86_400.0), "3.0 d");
    assert_eq!(human_age(-1.0), "?");
    assert_eq!(human_age(f64::NAN), "?");
    assert_eq!(human_age(f64::INFINITY), "?");
}

#[test]
fn cleaning_and_truncation() {
    assert_eq!(clean("plain"), "plain");
    assert_eq!(clean("a\nb\x1b[31m"), "a\\nb\\u{1b}[31m");
    assert_eq!(truncate_middle("abcdefghij", 10), "abcdefghij");
    assert_eq!(truncate_middle("abcdefghijk", 10), "abcd...ijk");
    assert_eq!(truncate_middle("abcdef", 2), "ab");
    assert_eq!(
        truncate_left("/very/long/path/model.py", 12),
        ".../model.py"
    );
    assert_eq!(truncate_middle("ééééééééééé", 7), "éé...éé");
}

#[test]
fn function_truncation_drops_parameters_then_templates() {
    let f = "at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>)";
    assert_eq!(truncate_function(f, 40), "at::native::empty_cuda(...)");
    let g = "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator<float, std::allocator<float>>::malloc(int, unsigned long, CUstream_st*)";
    let got = truncate_function(g, 90);
    assert_eq!(
        got,
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator<...>::malloc(...)"
    );
    assert_eq!(
        truncate_function(g, 60),
        "...::Native::DeviceCachingAllocator<...>::malloc(...)"
    );
    assert_eq!(truncate_function(g, 30), "...::malloc(...)");
    let h = truncate_function(g, 12);
    assert_eq!(width(&h), 12);

    assert_eq!(truncate_function("operator<", 5), "o...<");
    assert_eq!(truncate_function("short", 40), "short");
}
