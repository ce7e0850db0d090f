//! Thinking in a model's output: templates of reasoning models mark it (`<think>` ... `</think>`),
//! and the answer is what follows. [`ReasoningSplitter`] cuts streamed text into its reasoning
//! and its answer as it comes, holding back only what could still be part of a marker.
//!
//! Only a thinking block at the start of the output counts (after whitespace), or one the prompt
//! opened (templates that end the generation prompt with `<think>`); a marker later in the
//! answer is answer text.

/// The markers a chat template puts around thinking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingMarkers {
    /// Opens the thinking.
    pub open: String,
    /// Closes it.
    pub close: String,
}

impl ThinkingMarkers {
    /// The markers of a template whose source mentions both (`<think>` and `</think>`: Qwen3,
    /// DeepSeek-R1, GLM and others); None for templates without thinking.
    pub fn of_template(source: Option<&str>) -> Option<ThinkingMarkers> {
        let src = source?;
        (src.contains("<think>") && src.contains("</think>")).then(|| ThinkingMarkers {
            open: "<think>".into(),
            close: "</think>".into(),
        })
    }

    /// Whether a rendered prompt ends inside thinking (its last non-blank text is the opening
    /// marker).
    pub fn opened_by(&self, prompt_tail: &str) -> bool {
        prompt_tail.trim_end().ends_with(&self.open)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace yet: thinking may still open.
    Start,
    /// Inside the thinking.
    Thinking,
    /// The answer; `true` while the whitespace after the closing marker is still being dropped.
    Answer(bool),
}

/// Splits streamed output into reasoning and answer.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    markers: ThinkingMarkers,
    phase: Phase,
    /// Text that may still be part of a marker.
    held: String,
}

/// The length of the longest suffix of `s` that is a proper prefix of `marker` (on a char
/// boundary).
fn partial_suffix(s: &str, marker: &str) -> usize {
    (1..marker.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && marker.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

impl ReasoningSplitter {
    /// A splitter for `markers`; `opened`: the prompt ended inside thinking.
    pub fn new(markers: ThinkingMarkers, opened: bool) -> ReasoningSplitter {
        ReasoningSplitter {
            markers,
            phase: if opened {
                Phase::Thinking
            } else {
                Phase::Start
            },
            held: String::new(),
        }
    }

    /// Takes the next text; returns the reasoning and the answer it releases.
    pub fn push(&mut self, text: &str) -> (String, String) {
        let mut reasoning = String::new();
        let mut answer = String::new();
        self.held.push_str(text);
        loop {
            match self.phase {
                Phase::Start => {
                    let lead = self.held.trim_start();
                    if lead.starts_with(&self.markers.open) {
                        let at = self.held.len() - lead.len() + self.markers.open.len();
                        self.held.drain(..at);
                        self.phase = Phase::Thinking;
                    } else if lead.is_empty() || self.markers.open.starts_with(lead) {
                        break; // only whitespace, or the opening marker so far
                    } else {
                        self.phase = Phase::Answer(false);
                    }
                }
                Phase::Thinking => match self.held.find(&self.markers.close) {
                    Some(at) => {
                        reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + self.markers.close.len());
                        self.phase = Phase::Answer(true);
                    }
                    None => {
                        let keep = partial_suffix(&self.held, &self.markers.close);
                        let cut = self.held.len() - keep;
                        reasoning.push_str(&self.held[..cut]);
                        self.held.drain(..cut);
                        break;
                    }
                },
                Phase::Answer(dropping) => {
                    let rest = if dropping {
                        self.held.trim_start()
                    } else {
                        &self.held
                    };
                    if !rest.is_empty() {
                        self.phase = Phase::Answer(false);
                    }
                    answer.push_str(rest);
                    self.held.clear();
                    break;
                }
            }
        }
        (reasoning, answer)
    }

    /// Whether the output is inside the thinking now.
    pub fn thinking(&self) -> bool {
        matches!(self.phase, Phase::Thinking)
    }

    /// Ends the output: what was held goes where it was headed (an unclosed thinking is all
    /// reasoning).
    pub fn finish(self) -> (String, String) {
        match self.phase {
            Phase::Thinking => (self.held, String::new()),
            Phase::Start => (String::new(), self.held.trim_start().to_string()),
            Phase::Answer(_) => (String::new(), self.held),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn markers() -> ThinkingMarkers {
        ThinkingMarkers::of_template(Some("{% if x %}<think>{% endif %}</think>")).expect("markers")
    }

    /// Splits `pieces` streamed one by one; returns (reasoning, answer).
    fn split(pieces: &[&str], opened: bool) -> (String, String) {
        let mut s = ReasoningSplitter::new(markers(), opened);
        let (mut r, mut a) = (String::new(), String::new());
        for p in pieces {
            let (x, y) = s.push(p);
            r.push_str(&x);
            a.push_str(&y);
        }
        let (x, y) = s.finish();
        (r + &x, a + &y)
    }

    #[test]
    fn thinking_then_answer_however_the_text_is_cut() {
        let whole = "\n<think>\nweigh it</think>\n\nThe answer.";
        let want = ("\nweigh it".to_string(), "The answer.".to_string());
        assert_eq!(split(&[whole], false), want);
        // Every cut into single characters and into pairs gives the same split.
        let chars: Vec<String> = whole.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split(&refs, false), want);
        for at in 0..whole.len() {
            if whole.is_char_boundary(at) {
                assert_eq!(
                    split(&[&whole[..at], &whole[at..]], false),
                    want,
                    "cut at {at}"
                );
            }
        }
    }

    #[test]
    fn prompts_that_open_thinking_and_outputs_without_it() {
        assert_eq!(
            split(&["plan</thi", "nk>ok"], true),
            ("plan".into(), "ok".into())
        );
        assert_eq!(
            split(&["Hello <think> there"], false),
            (String::new(), "Hello <think> there".into())
        );
        assert_eq!(
            split(&["<thi", "s is text"], false),
            (String::new(), "<this is text".into())
        );
        // Unclosed thinking is all reasoning; a marker after the answer starts is answer text.
        assert_eq!(
            split(&["<think>still going"], false),
            ("still going".into(), String::new())
        );
        assert_eq!(
            split(&["<think>a</think>b</think>"], false),
            ("a".into(), "b</think>".into())
        );
        assert_eq!(split(&["  "], false), (String::new(), String::new()));
    }

    #[test]
    fn markers_come_from_the_template() {
        assert!(ThinkingMarkers::of_template(Some("{{ messages }}")).is_none());
        assert!(ThinkingMarkers::of_template(None).is_none());
        let m = markers();
        assert!(m.opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!m.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }
}
