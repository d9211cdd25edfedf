//! The `oceancode-proxy` binary: a thin entry point over [`cli`].

mod cli;

/// mimalloc: large request bodies (up to tens of MB, many at once) are reused
/// from its segments instead of being mapped, faulted in and unmapped per
/// request as with the system allocator; see docs/benchmarks.md. The
/// `heap-profile` feature keeps the system allocator, for heaptrack.
#[cfg(not(feature = "heap-profile"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    cli::main()
}
