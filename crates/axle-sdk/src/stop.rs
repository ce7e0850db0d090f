//! Stop strings on streamed text: text is released only once it can no longer be the start of a
//! stop string, so a partial stop string is never emitted.

/// Matches stop strings over a stream of text chunks.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    matched: Option<String>,
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// The stop string that matched (the earliest in the text where several did), if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Adds text; returns (text safe to emit, whether a stop string matched). After a match the
    /// returned text is everything before the stop string.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some((pos, stop)) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|p| (p, s)))
            .min_by_key(|&(p, _)| p)
        {
            let out = self.held[..pos].to_string();
            self.matched = Some(stop.clone());
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if self.held.ends_with(&s[..i]) {
                    keep = keep.max(i);
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// Releases whatever is held (the stream ended without a match).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_partial_stops_and_cuts_at_match() {
        let mut m = StopMatcher::new(vec!["</end>".into(), "STOP".into()]);
        assert_eq!(m.push("hello </e"), ("hello ".into(), false));
        assert_eq!(m.push("nx"), ("</enx".into(), false));
        assert_eq!(m.push(" ST"), (" ".into(), false));
        assert_eq!(m.matched(), None);
        assert_eq!(m.push("OP and more"), ("".into(), true));
        assert_eq!(m.matched(), Some("STOP"));
        let mut m = StopMatcher::new(vec!["ab".into()]);
        assert_eq!(m.push("xa"), ("x".into(), false));
        assert_eq!(m.finish(), "a");
    }
}
