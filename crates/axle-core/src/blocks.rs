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
        }
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
        let id = match self.free.pop_first() {
            Some(id) => id,
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
