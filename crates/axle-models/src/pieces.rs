//! Pieces of a step's activations: a run of columns, and pieces concatenated back in order.
use axle_ggml::{Context, Tensor};

/// Columns `first..first + cols` of the 2-D `x` (`x` itself when that is all of it).
pub(crate) fn columns<'a>(g: &'a Context, x: Tensor<'a>, first: i64, cols: i64) -> Tensor<'a> {
    let [k, n, ..] = x.ne();
    if (first, cols) == (0, n) {
        return x;
    }
    let nb1 = x.nb()[1];
    g.view(x, &[k, cols], &[nb1], first as usize * nb1)
}

/// Concatenates tensors along `dim`, pairwise (a balanced tree: each element is copied about
/// log2(pieces) times rather than once per piece after it).
pub(crate) fn concat_all<'a>(g: &'a Context, mut pieces: Vec<Tensor<'a>>, dim: i32) -> Tensor<'a> {
    assert!(!pieces.is_empty(), "nothing to concatenate");
    while pieces.len() > 1 {
        let mut next = Vec::with_capacity(pieces.len().div_ceil(2));
        let mut it = pieces.into_iter();
        while let Some(a) = it.next() {
            next.push(match it.next() {
                Some(b) => g.concat(a, b, dim),
                None => a,
            });
        }
        pieces = next;
    }
    pieces
        .pop()
        .unwrap_or_else(|| unreachable!("one piece left"))
}
