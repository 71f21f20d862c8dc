//! Hand-built dumps for tests, in this crate and the ones above it (feature `fixtures`).

use crate::model::*;

pub fn frame(function: Option<&str>, file: Option<&str>, line: Option<u32>) -> Frame {
    Frame {
        address: "0x7f00deadbeef".into(),
        function: function.map(Into::into),
        file: file.map(Into::into),
        line,
        module: None,
        inlined: false,
        kind: Default::default(),
    }
}

pub fn site(bytes: u64, count: u64) -> Site {
    Site {
        bytes,
        count,
        stack: vec![
            frame(None, None, None),
            frame(Some("forward"), Some("model.py"), Some(42)),
            frame(Some("train_step"), Some("train.py"), Some(88)),
        ],
    }
}

/// A hand-built OOM dump on device 0: `total`/`free` may be None.
pub fn oom_dump(request: u64, total: Option<u64>, free: Option<u64>, tracked: u64) -> Dump {
    Dump {
        schema: SCHEMA.into(),
        reason: "oom".into(),
        time: "2026-11-29T15:43:11.123Z".into(),
        time_unix_ms: 1_795_966_991_123,
        process: ProcessInfo {
            pid: 4812,
            host: "gpu-node-7".into(),
            command_line: vec!["python".into(), "train.py".into()],
            rank: None,
            local_rank: None,
            world_size: None,
            launcher: None,
            job_id: None,
            kubernetes: None,
        },
        failed_request: Some(FailedRequest {
            bytes: request,
            api: "cudaMalloc".into(),
            device: 0,
            error_code: 2,
            stack: vec![frame(Some("cudaMalloc"), None, None)],
            stack_merge: None,
            failures_in_burst: 1,
            recovered: None,
            resolution: None,
            last_failure: None,
            recovered_before: 0,
        }),
        devices: vec![DeviceInfo {
            index: 0,
            name: Some("NVIDIA H200".into()),
            total_bytes: total,
            free_bytes: free,
            tracked_bytes: tracked,
            tracked_count: 12,
            peak_tracked_bytes: tracked,
            uuid: None,
            memory_cap: None,
        }],
        pinned_host: PinnedHost::default(),
        largest_holders: vec![],
        sites: if tracked > 0 {
            vec![site(tracked / 4, 3), site(tracked / 2, 5)]
        } else {
            vec![]
        },
        free_blocks: FreeBlocks {
            source: "unavailable".into(),
            reason: Some("under LD_PRELOAD the framework's cache hides free blocks".into()),
            total_free_bytes: None,
            largest_free_bytes: None,
            fragmentation: None,
            histogram: vec![],
            ..Default::default()
        },
        verdict: Verdict {
            findings: vec![],
            kind: "ignored".into(),
            summary: String::new(),
            evidence: vec![],
            suggestions: vec![],
            retry: None,
        },
        recording: Recording::default(),
        pools: Vec::new(),
        vmm: None,
        host: None,
        gpu_processes: None,
        growth: None,
        // A PyTorch program (train.py, model.py): torch is loaded.
        config: Some(ConfigSnapshot {
            frameworks: vec!["torch".into()],
            ..Default::default()
        }),
        request_sizes: None,
        framework: None,
        library_memory: None,
        post_mortem: None,
    }
}
