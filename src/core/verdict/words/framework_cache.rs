//! The words of [`FRAMEWORK_CACHE`].

use super::new_finding;
use crate::verdict::context::{Cache, Ctx};
use crate::verdict::names::FRAMEWORK_CACHE;
use dump::model::Finding;
use dump::units::{clean, human_bytes};

pub(in crate::verdict) fn finding(c: &Ctx, k: &Cache) -> Finding {
    let req = &c.req;
    let free =
        c.n.free
            .map(|f| format!(" with the device's {} free", human_bytes(f)))
            .unwrap_or_default();
    let mut f = new_finding(
        FRAMEWORK_CACHE,
        k.total_free,
        format!(
            "the framework's cache holds {} reserved but unallocated ({} releasable){}, enough for the {req} request",
            human_bytes(k.total_free),
            human_bytes(k.releasable),
            free
        ),
        format!(
            "The framework's cache ({}) holds {} that it reserved from the device but did not hand out; {} of it is in \
             segments with no live block, which releasing the cache returns to the device: together{free} that is enough \
             for the {req} request. The memory is not fragmented (the request is larger than the cache's free total), it is \
             kept in reserve.{}",
            clean(&k.source),
            human_bytes(k.total_free),
            human_bytes(k.releasable),
            c.top_text(c.used)
        ),
    );
    f.evidence.push(format!(
        "reserved but unallocated: {}, releasable {}, largest free block {}",
        human_bytes(k.total_free),
        human_bytes(k.releasable),
        human_bytes(k.largest)
    ));
    f.suggestions.push(
        "Release the cache where memory peaks change (between training and evaluation, or before a large allocation): \
         `torch.cuda.empty_cache()`."
            .to_string(),
    );
    f.suggestions.push(
        "Let the cache give memory back by itself: `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8` (or a \
         smaller cache, `max_split_size_mb`)."
            .to_string(),
    );
    f
}
