//! KV block accounting: a fixed pool of blocks of `block_size` slots, reference counts, and a
//! prefix cache where each full block is keyed by a hash chain (parent hash, its token ids, the
//! model identity). A block whose last owner leaves keeps its contents and stays findable until it
//! is evicted, least recently used first. No tensors here: the runner owns the memory, this owns
//! the bookkeeping.
use crate::TokenId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

/// A physical block id.
pub type BlockId = u32;

/// Identity of one full block's contents: its hash chain value and, to rule out collisions, the
/// tokens themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockKey {
    /// Hash of (parent hash, tokens, model id).
    pub hash: u64,
    /// The block's tokens.
    pub tokens: Vec<TokenId>,
}

/// How a block's positions were computed, where an engine computes prompt rows and generated
/// rows with different arithmetic (see [`crate::SchedulerConfig::prompt_classes`]): the class of
/// the prompt they came from and how many of the block's positions lie in that prompt. Two blocks
/// of the same tokens but different origins hold different numbers, so their keys differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockOrigin {
    /// The prompt's class: how many of the configured thresholds its length reaches.
    pub prompt_class: u32,
    /// Positions of the block inside the prompt (the rest were generated).
    pub prompt_positions: u32,
}

/// Computes the key of the block after `parent` (None for the first block); `origin` is `None`
/// where every row is computed alike (the key is then that of the tokens alone).
pub fn block_key(
    parent: Option<u64>,
    tokens: &[TokenId],
    model_id: u64,
    origin: Option<BlockOrigin>,
) -> BlockKey {
    // DefaultHasher::new() uses fixed keys, so hashes are stable across runs (deterministic).
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    model_id.hash(&mut h);
    if let Some(o) = origin {
        o.hash(&mut h);
    }
    BlockKey {
        hash: h.finish(),
        tokens: tokens.to_vec(),
    }
}

#[derive(Debug, Clone, Default)]
struct Block {
    refs: u32,
    key: Option<BlockKey>,
    /// Logical time of last release (for LRU eviction of cached blocks).
    last_used: u64,
}

/// The block pool.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: u32,
    blocks: Vec<Block>,
    /// Blocks with no owner and no cached contents, handed out lowest first: a sequence's blocks
    /// then tend to lie in ascending order, so attention visits its slots in logical order and
    /// the same request computes the same numbers however earlier requests left the pool.
    free: BTreeSet<BlockId>,
    /// Cached blocks with no owner, by release time: evicted oldest first.
    evictable: BTreeMap<(u64, BlockId), ()>,
    /// Cached contents -> block.
    cached: HashMap<u64, BlockId>,
    clock: u64,
    caching: bool,
    /// Lanes the pool is cut into for [`BlockPool::allocate_after`] (1: one lane, the whole pool).
    lanes: u32,
}

impl BlockPool {
    /// A pool of `n_blocks` blocks of `block_size` slots; `caching` enables prefix reuse.
    pub fn new(n_blocks: u32, block_size: u32, caching: bool) -> BlockPool {
        BlockPool {
            block_size,
            blocks: vec![Block::default(); n_blocks as usize],
            free: (0..n_blocks).collect(),
            evictable: BTreeMap::new(),
            cached: HashMap::new(),
            clock: 0,
            caching,
            lanes: 1,
        }
    }

    /// Cuts the pool into `lanes` lanes of equal size (at least one block each) where
    /// [`BlockPool::allocate_after`] starts new sequences, so that sequences that grow side by
    /// side keep their blocks consecutive (a device then reads each one's KV in place instead of
    /// gathering it every step). 1 (the default): new sequences take the lowest free block.
    pub fn with_lanes(mut self, lanes: u32) -> BlockPool {
        self.lanes = lanes.clamp(1, self.n_blocks().max(1));
        self
    }

    /// Slots per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Total blocks.
    pub fn n_blocks(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Blocks that can be handed out now (free or evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks held by at least one owner.
    pub fn in_use(&self) -> usize {
        self.blocks.iter().filter(|b| b.refs > 0).count()
    }

    /// Whether prefix caching is on.
    pub fn caching(&self) -> bool {
        self.caching
    }

    /// Takes one block for a new owner (evicting the least recently used cached block if needed).
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.free.first().copied();
        self.take(id)
    }

    /// Takes one block for a sequence whose last block is `last` (`None`: its first block).
    /// With one lane, as [`BlockPool::allocate`]. With lanes: the block right after `last` where it
    /// is free, else the first block of the lowest lane that is wholly free for a sequence's first
    /// block, else the lowest free block after `last` (so that a sequence's blocks still ascend),
    /// else the lowest free one, else an evicted cached block.
    pub fn allocate_after(&mut self, last: Option<BlockId>) -> Option<BlockId> {
        if self.lanes <= 1 {
            return self.allocate();
        }
        let id = match last {
            Some(b) if self.free.contains(&(b + 1)) => Some(b + 1),
            Some(b) => self
                .free
                .range(b + 1..)
                .next()
                .or_else(|| self.free.first())
                .copied(),
            None => {
                let size = self.n_blocks() / self.lanes;
                (0..self.lanes)
                    .map(|l| l * size)
                    .find(|&start| self.free.range(start..start + size).count() == size as usize)
                    .or_else(|| self.free.first().copied())
            }
        };
        self.take(id)
    }

    /// Hands out `free` (a free block), or evicts the least recently used cached block.
    fn take(&mut self, free: Option<BlockId>) -> Option<BlockId> {
        let id = match free {
            Some(id) => {
                self.free.remove(&id);
                id
            }
            None => {
                let (&(t, id), _) = self.evictable.iter().next()?;
                self.evictable.remove(&(t, id));
                if let Some(key) = self.blocks[id as usize].key.take() {
                    self.cached.remove(&key.hash);
                }
                id
            }
        };
        let b = &mut self.blocks[id as usize];
        debug_assert_eq!(b.refs, 0);
        b.refs = 1;
        b.key = None;
        Some(id)
    }

    /// Looks up a cached block with these contents and takes a reference to it.
    pub fn reuse(&mut self, key: &BlockKey) -> Option<BlockId> {
        if !self.caching {
            return None;
        }
        let &id = self.cached.get(&key.hash)?;
        let b = &mut self.blocks[id as usize];
        if b.key.as_ref() != Some(key) {
            return None; // hash collision: never serve other tokens
        }
        if b.refs == 0 {
            self.evictable.remove(&(b.last_used, id));
        }
        b.refs += 1;
        Some(id)
    }

    /// Records that `id` (owned by the caller) now holds the full block `key`, so later requests
    /// can reuse it. A block with the same contents already cached is left as the canonical one.
    pub fn register(&mut self, id: BlockId, key: BlockKey) {
        if !self.caching
            || self.cached.contains_key(&key.hash)
            || self.blocks[id as usize].key.is_some()
        {
            return;
        }
        self.cached.insert(key.hash, id);
        self.blocks[id as usize].key = Some(key);
    }

    /// Drops one reference; the last release frees the block or, if cached, makes it evictable.
    pub fn release(&mut self, id: BlockId) {
        self.clock += 1;
        let b = &mut self.blocks[id as usize];
        assert!(b.refs > 0, "release of unowned block {id}");
        b.refs -= 1;
        if b.refs == 0 {
            b.last_used = self.clock;
            if b.key.is_some() {
                self.evictable.insert((b.last_used, id), ());
            } else {
                self.free.insert(id);
            }
        }
    }

    /// Reference count of a block.
    pub fn refs(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].refs
    }

    /// Internal consistency: every block is exactly one of owned / free / evictable, and the cache
    /// index points at blocks carrying that key. Used by tests after every step.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = vec![0u8; self.blocks.len()];
        for &id in &self.free {
            seen[id as usize] += 1;
            if self.blocks[id as usize].refs != 0 || self.blocks[id as usize].key.is_some() {
                return Err(format!("free block {id} is owned or cached"));
            }
        }
        for &(_, id) in self.evictable.keys() {
            seen[id as usize] += 1;
            if self.blocks[id as usize].refs != 0 || self.blocks[id as usize].key.is_none() {
                return Err(format!("evictable block {id} is owned or uncached"));
            }
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if b.refs > 0 {
                seen[i] += 1;
            }
            if seen[i] != 1 {
                return Err(format!("block {i} is in {} states", seen[i]));
            }
        }
        for (&h, &id) in &self.cached {
            if self.blocks[id as usize].key.as_ref().map(|k| k.hash) != Some(h) {
                return Err(format!("cache index {h:x} -> block {id} with another key"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_then_evict_lru() {
        let mut p = BlockPool::new(3, 4, true);
        let k1 = block_key(None, &[1, 2, 3, 4], 7, None);
        let k2 = block_key(Some(k1.hash), &[5, 6, 7, 8], 7, None);
        let (a, b) = (p.allocate().unwrap(), p.allocate().unwrap());
        p.register(a, k1.clone());
        p.register(b, k2.clone());
        p.release(a);
        p.release(b);
        assert_eq!(p.in_use(), 0);
        assert_eq!(p.reuse(&k1), Some(a));
        p.release(a);
        // Free block first, then the least recently released cached block (b), then a.
        let c = p.allocate().unwrap();
        assert!(c != a && c != b);
        assert_eq!(p.allocate(), Some(b));
        assert_eq!(p.reuse(&k2), None, "evicted contents are gone");
        assert_eq!(p.reuse(&k1), Some(a));
        assert_eq!(p.allocate(), None);
        p.check().unwrap();
    }

    /// Takes `n` blocks for one sequence, each after the last.
    fn grow(p: &mut BlockPool, seq: &mut Vec<BlockId>, n: usize) {
        for _ in 0..n {
            let b = p.allocate_after(seq.last().copied()).expect("a block");
            seq.push(b);
        }
    }

    #[test]
    fn lanes_keep_sequences_that_grow_side_by_side_consecutive() {
        // Three sequences growing a block each in turn: one lane each, consecutive blocks.
        let mut p = BlockPool::new(12, 4, false).with_lanes(3);
        let mut seqs = vec![Vec::new(); 3];
        for _ in 0..3 {
            for s in seqs.iter_mut() {
                grow(&mut p, s, 1);
            }
        }
        assert_eq!(seqs, [vec![0, 1, 2], vec![4, 5, 6], vec![8, 9, 10]]);
        // Past its lane a sequence takes the next free block above its last (still ascending).
        grow(&mut p, &mut seqs[0], 2);
        assert_eq!(seqs[0], [0, 1, 2, 3, 7]);
        // A new sequence with no wholly free lane takes the lowest free block.
        let mut late = Vec::new();
        grow(&mut p, &mut late, 1);
        assert_eq!(late, [11]);
        p.check().unwrap();
        // A finished sequence's lane is free for the next one.
        for b in seqs[1].drain(..) {
            p.release(b);
        }
        let mut next = Vec::new();
        grow(&mut p, &mut next, 2);
        assert_eq!(next, [4, 5]);
        // Without lanes: the lowest free block, whatever the sequence's last.
        let mut one = BlockPool::new(6, 4, false);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            grow(&mut one, &mut a, 1);
            grow(&mut one, &mut b, 1);
        }
        assert_eq!((a, b), (vec![0, 2], vec![1, 3]));
    }

    #[test]
    fn lanes_fall_back_to_evicting_cached_blocks() {
        let mut p = BlockPool::new(4, 2, true).with_lanes(2);
        let k = block_key(None, &[1, 2], 7, None);
        let mut s = Vec::new();
        grow(&mut p, &mut s, 4);
        assert_eq!(s, [0, 1, 2, 3]);
        p.register(s[0], k.clone());
        for b in s.drain(..) {
            p.release(b);
        }
        // Blocks 1-3 are free; block 0 is cached (evictable): lane 0 is not wholly free.
        grow(&mut p, &mut s, 1);
        assert_eq!(s, [2]);
        grow(&mut p, &mut s, 2);
        assert_eq!(s, [2, 3, 1]);
        grow(&mut p, &mut s, 1);
        assert_eq!(s, [2, 3, 1, 0], "the cached block is evicted last");
        assert_eq!(p.reuse(&k), None);
        assert_eq!(p.allocate_after(Some(0)), None);
        p.check().unwrap();
    }

    #[test]
    fn keys_depend_on_parent_tokens_and_model() {
        let a = block_key(None, &[1, 2], 1, None);
        assert_ne!(a, block_key(None, &[1, 2], 2, None));
        assert_ne!(
            block_key(Some(a.hash), &[3], 1, None),
            block_key(None, &[3], 1, None)
        );
        // The same tokens computed from another origin are other contents.
        let origin = |prompt_class, prompt_positions| {
            Some(BlockOrigin {
                prompt_class,
                prompt_positions,
            })
        };
        let b = block_key(None, &[1, 2], 1, origin(1, 2));
        assert_ne!(a, b);
        assert_eq!(b, block_key(None, &[1, 2], 1, origin(1, 2)));
        assert_ne!(b, block_key(None, &[1, 2], 1, origin(2, 2)));
        assert_ne!(b, block_key(None, &[1, 2], 1, origin(1, 1)));
        let mut p = BlockPool::new(2, 2, false);
        let x = p.allocate().unwrap();
        p.register(x, a.clone());
        p.release(x);
        assert_eq!(p.reuse(&a), None, "caching off");
        p.check().unwrap();
    }
}
