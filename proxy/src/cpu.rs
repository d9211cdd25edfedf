//! CPU-bound work on the request path (hashing, parsing, rendering a large
//! body; reading the context file) kept off the reactor where it can be.

/// Bodies from this size on are prepared with [`run`] (`block_in_place`).
pub(crate) const INLINE_MAX: usize = 1 << 20;

/// Run CPU-bound work: `block_in_place` on the multi-threaded runtime (so the
/// reactor keeps serving other connections), inline elsewhere.
pub(crate) fn run<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
