//! Streaming detokenization: tokens arrive one at a time and a UTF-8 character may span several of
//! them, so bytes are held back until they form complete characters.
use super::{TokenId, Tokenizer};

/// Turns a stream of tokens into a stream of valid UTF-8 text chunks.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds a token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, t: TokenId) -> String {
        self.pending.extend(tok.piece(t, false));
        self.take_complete()
    }

    fn take_complete(&mut self) -> String {
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let s = s.to_string();
                self.pending.clear();
                s
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // An invalid sequence (not just an incomplete tail) can never complete: emit it lossily.
                let end = match e.error_len() {
                    Some(bad) => valid + bad,
                    None => valid,
                };
                let out = String::from_utf8_lossy(&self.pending[..end]).into_owned();
                self.pending.drain(..end);
                if e.error_len().is_some() {
                    return out + &self.take_complete();
                }
                out
            }
        }
    }

    /// Flushes whatever is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_split_characters() {
        let mut d = StreamDecoder::new();
        d.pending.extend_from_slice(&[0xF0, 0x9F]);
        assert_eq!(d.take_complete(), "");
        d.pending.extend_from_slice(&[0x98, 0x80, b'a']);
        assert_eq!(d.take_complete(), "\u{1F600}a");
        d.pending.extend_from_slice(&[0xFF, b'b']);
        assert_eq!(d.take_complete(), "\u{FFFD}b");
        d.pending.extend_from_slice(&[0xE2, 0x82]);
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
