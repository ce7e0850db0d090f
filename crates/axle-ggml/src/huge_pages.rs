//! Host memory backed by 2 MiB transparent huge pages, for the weights a CPU step streams.
//!
//! A decode step on the CPU reads every weight once: a 270M model's 260 MB, most of it the
//! 262k-row head. Used in place from the file's mapping (4 KiB page-cache pages), or from
//! ggml's own allocations (4 KiB anonymous pages), that stream crosses a page every 4 KiB, and
//! each page's translation misses the TLB. In 2 MiB pages it crosses 512 times fewer. On this
//! project's 2-core x86 machine that made Gemma 3's decode step 12-20% faster with the same
//! kernels on the same bytes (`benchmarks/artifacts/reruns/cpu-huge-pages/`).
//!
//! Linux offers such pages to a mapping advised with `MADV_HUGEPAGE` when
//! `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or `madvise`. Elsewhere (other
//! systems, or the setting `never`) nothing here applies: callers keep weights where they were.
use crate::{Error, Result};
use memmap2::{Mmap, MmapOptions};

/// The size of a transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Whether this system hands out transparent huge pages to advised anonymous memory.
pub fn huge_pages_offered() -> bool {
    cfg!(target_os = "linux")
        && std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}

/// Read-only anonymous memory whose bytes start on a huge-page boundary, advised for huge pages,
/// filled once at creation.
pub(crate) struct HugeRegion {
    map: Mmap,
    /// Offset of the first huge-page boundary in `map`.
    skip: usize,
    len: usize,
}

impl HugeRegion {
    /// A region of `len` bytes, filled by `fill` (given the whole zeroed region) before it is
    /// made read-only. The pages are advised before `fill` touches them, so that the kernel
    /// faults them in as huge pages.
    pub(crate) fn filled(len: usize, fill: impl FnOnce(&mut [u8])) -> Result<HugeRegion> {
        let io = |what: &str, e: std::io::Error| Error::Alloc(format!("{what}: {e}"));
        let mut map = MmapOptions::new()
            .len(len + HUGE_PAGE)
            .map_anon()
            .map_err(|e| io("anonymous memory for weights", e))?;
        let skip = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
        let bytes = &mut map[skip..skip + len];
        advise_huge(bytes.as_mut_ptr(), len);
        fill(bytes);
        let map = map
            .make_read_only()
            .map_err(|e| io("making weights read-only", e))?;
        Ok(HugeRegion { map, skip, len })
    }

    /// The region's first byte (huge-page aligned).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.map[self.skip..].as_ptr()
    }

    /// The region's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Advises the whole huge pages inside `len` bytes at `base` (memory ggml allocated and has not
/// written yet) for huge pages. Best effort: a refusal leaves ordinary pages.
pub(crate) fn advise_huge(base: *mut u8, len: usize) {
    let start = (base as usize).div_ceil(HUGE_PAGE) * HUGE_PAGE;
    let end = (base as usize + len) / HUGE_PAGE * HUGE_PAGE;
    if end <= start {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: [start, end) lies inside the caller's allocation of `len` bytes at `base`;
    // MADV_HUGEPAGE changes how its pages are backed, never their contents.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_is_aligned_and_holds_what_was_written() {
        let r = HugeRegion::filled(3 * HUGE_PAGE + 5, |b| {
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i % 251) as u8;
            }
        })
        .unwrap();
        assert_eq!(r.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(r.len(), 3 * HUGE_PAGE + 5);
        // SAFETY (test): the region is `len` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) };
        assert!(bytes.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn advised_region_gets_huge_pages_where_offered() {
        if !huge_pages_offered() {
            // The system's setting, not ours: say so rather than pass silently.
            eprintln!("transparent huge pages are off here: nothing to check");
            return;
        }
        let r = HugeRegion::filled(8 * HUGE_PAGE, |b| b.fill(1)).unwrap();
        let start = r.as_ptr() as usize;
        // The mapping's own line in smaps: its AnonHugePages must cover some of it.
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut in_region = false;
        let mut huge_kib = 0u64;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        in_region = a <= start && start < b;
                        continue;
                    }
                }
            }
            if in_region && line.starts_with("AnonHugePages:") {
                huge_kib = line.split_whitespace().nth(1).unwrap().parse().unwrap();
            }
        }
        assert!(
            huge_kib >= 2048,
            "no huge pages in the region ({huge_kib} KiB)"
        );
    }
}
