//! SentencePiece-style encoding: start from UTF-8 characters, repeatedly merge the adjacent pair
//! whose joined text is a vocabulary token with the highest score (leftmost on ties), then map
//! pieces to ids, splitting unknown pieces back along their merges and finally into byte tokens.
use super::{TokenId, Tokenizer};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Cand {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

order_from_cmp!(Cand);
impl Ord for Cand {
    // Max-heap: higher score first, then the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

struct Session<'a> {
    tok: &'a Tokenizer,
    text: &'a str,
    syms: Vec<Sym>,
    heap: BinaryHeap<Cand>,
    /// For a merged piece's text, the pair it was last formed from (used to split unknown pieces).
    rev: HashMap<&'a str, (usize, usize)>,
}

impl<'a> Session<'a> {
    fn try_pair(&mut self, left: Option<usize>, right: Option<usize>) {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (a, b) = (self.syms[l], self.syms[r]);
        let piece = &self.text[a.start..a.start + a.len + b.len];
        let Some(id) = self.tok.token_id(piece) else {
            return;
        };
        self.heap.push(Cand {
            left: l,
            right: r,
            score: self.tok.scores[id as usize],
            len: piece.len(),
        });
        self.rev.insert(piece, (l, r));
    }

    fn emit(&self, i: usize, out: &mut Vec<TokenId>) {
        let s = self.syms[i];
        let piece = &self.text[s.start..s.start + s.len];
        if let Some(id) = self.tok.token_id(piece) {
            out.push(id);
            return;
        }
        match self.rev.get(piece) {
            Some(&(l, r)) if l != i || r != i => {
                self.emit(l, out);
                self.emit(r, out);
            }
            _ => {
                for &b in piece.as_bytes() {
                    out.extend(self.tok.byte_token(b));
                }
            }
        }
    }
}

pub(super) fn encode(tok: &Tokenizer, text: &str, out: &mut Vec<TokenId>) {
    if text.is_empty() {
        return;
    }
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let n = starts.len();
    let syms = (0..n)
        .map(|i| Sym {
            start: starts[i],
            len: starts.get(i + 1).copied().unwrap_or(text.len()) - starts[i],
            prev: i.checked_sub(1),
            next: (i + 1 < n).then_some(i + 1),
        })
        .collect();
    let mut s = Session {
        tok,
        text,
        syms,
        heap: BinaryHeap::new(),
        rev: HashMap::new(),
    };
    for i in 1..n {
        s.try_pair(Some(i - 1), Some(i));
    }
    while let Some(c) = s.heap.pop() {
        let (l, r) = (s.syms[c.left], s.syms[c.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != c.len {
            continue;
        }
        s.syms[c.left].len += r.len;
        s.syms[c.right].len = 0;
        s.syms[c.left].next = r.next;
        if let Some(nx) = r.next {
            s.syms[nx].prev = Some(c.left);
        }
        let (prev, next) = (s.syms[c.left].prev, s.syms[c.left].next);
        s.try_pair(prev, Some(c.left));
        s.try_pair(Some(c.left), next);
    }
    let mut i = Some(0);
    while let Some(k) = i {
        s.emit(k, out);
        i = s.syms[k].next;
    }
}
