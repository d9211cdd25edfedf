//! The `oceancode-proxy` binary: a thin entry point over [`cli`].

mod cli;

/// mimalloc: large request bodies (up to tens of MB, many at once) are reused
/// from its segments instead of being mapped, faulted in and unmapped per
/// request as with the system allocator; see docs/benchmarks.md. The
/// `heap-profile` feature keeps the system allocator, for heaptrack.
#[cfg(not(feature = "heap-profile"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (`mi_option_purge_delay`, the 16th of
/// `mi_option_t` in mimalloc 3.3).
#[cfg(not(feature = "heap-profile"))]
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// The purge delay set at start, ms.
#[cfg(not(feature = "heap-profile"))]
const PURGE_DELAY_MS: std::ffi::c_long = 10;

#[cfg(not(feature = "heap-profile"))]
#[allow(unsafe_code)] // the allocator's C API has no safe wrapper
mod mi {
    extern "C" {
        pub(super) fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    }
}

/// Memory mimalloc frees goes back to the system after 10 ms instead of
/// after a second (its default): request bodies of several MB come and go
/// by the dozen, and a second of them kept resident was the largest part
/// of the peak RSS at 8 MB x 64. 0 (at once) kept no less at that peak and
/// slowed the 100-session open (pages faulted in again); see
/// docs/benchmarks.md, issue 38. `MIMALLOC_PURGE_DELAY` in the environment
/// still wins.
#[cfg(not(feature = "heap-profile"))]
fn purge_soon() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mi_option_set only stores the value of a valid option
        // (purge_delay), which mimalloc reads when it next purges.
        #[allow(unsafe_code)]
        unsafe {
            mi::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
        }
    }
}

fn main() {
    #[cfg(not(feature = "heap-profile"))]
    purge_soon();
    cli::main()
}
