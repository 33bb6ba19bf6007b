//! The operator's resident memory: glibc's allocator keeps what a burst freed (the first
//! list of every cache, a re-list after a watch expired) unless told to give it back, and
//! grows one arena per thread that allocates. Both matter more than any cache for an
//! operator whose steady state is a few tens of MiB.

/// Arenas glibc may create (its default is eight per core): the operator's allocations are
/// small and few threads allocate at once.
const ARENAS: i32 = 2;

/// Call once at start, before the runtime's threads allocate.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX accepts any positive value.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// Returns freed heap pages to the operating system (after the caches' first lists, and
/// periodically after re-lists and bursts).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}
