//! Chat templates: the model's own Jinja template (`tokenizer.chat_template` in the GGUF) rendered
//! with minijinja and the globals Hugging Face templates rely on. Families whose GGUF files often
//! ship without a template get a built-in one, chosen by architecture, never silently.
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Variables a chat template reads beside the messages, by name (`enable_thinking`, ...).
pub type TemplateVars = BTreeMap<String, serde_json::Value>;

/// The variables [`ChatTemplate::render`] sets itself, which [`TemplateVars`] never override.
pub const TEMPLATE_INPUTS: [&str; 5] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// One chat message, with the fields Hugging Face templates read for tool use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant message's tool calls: `[{type: "function", function: {name, arguments}}]`,
    /// arguments as a JSON object (what templates render).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool message's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool message's function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with the given role.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// Chat template errors.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The model has no template and none is built in for its architecture.
    #[error("this model has no chat template (no `tokenizer.chat_template` in the GGUF and none built in for `{0}`); use a plain prompt instead")]
    NoTemplate(String),
    /// The template failed to compile or render.
    #[error("chat template error: {0}")]
    Render(String),
}

/// Gemma's turn format, for Gemma GGUF files that carry no template.
const GEMMA_TEMPLATE: &str = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// A compiled chat template with the model's special token texts.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

fn strftime_now(fmt: String) -> String {
    chrono::Local::now().format(&fmt).to_string()
}

impl ChatTemplate {
    /// Compiles `source` (or the built-in template for `arch` when `source` is None).
    pub fn new(
        source: Option<&str>,
        arch: &str,
        bos: &str,
        eos: &str,
    ) -> Result<ChatTemplate, ChatError> {
        let source = match source {
            Some(s) => s.to_string(),
            None if arch.starts_with("gemma") => GEMMA_TEMPLATE.to_string(),
            None => return Err(ChatError::NoTemplate(arch.into())),
        };
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source)
            .map_err(|e| ChatError::Render(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// Renders messages (and tools, when given as JSON) into the prompt text; `vars` are more
    /// variables the template may read (`enable_thinking`, `reasoning_effort`, ...), never
    /// overriding the ones above.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        vars: &TemplateVars,
    ) -> Result<String, ChatError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ChatError::Render(e.to_string()))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
            tools => tools.map(Value::from_serialize),
            ..Value::from_serialize(vars)
        };
        tmpl.render(ctx)
            .map_err(|e| ChatError::Render(format!("{e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_hf_style_template() {
        let src = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}<|{{ m.role }}|>{{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
        let t = ChatTemplate::new(Some(src), "llama", "<s>", "</s>").unwrap();
        let out = t
            .render(
                &[ChatMessage::new("user", " hi ")],
                true,
                None,
                &TemplateVars::new(),
            )
            .unwrap();
        assert_eq!(out, "<|user|>hi\n<|assistant|>");
        let err = t
            .render(
                &[ChatMessage::new("system", "x")],
                true,
                None,
                &TemplateVars::new(),
            )
            .unwrap_err();
        assert!(err.to_string().contains("no system"), "{err}");
    }

    #[test]
    fn variables_reach_the_template_and_never_replace_its_inputs() {
        let src = "{{ messages[0].content }}|{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{{ reasoning_effort | default('medium') }}";
        let t = ChatTemplate::new(Some(src), "qwen3", "", "").unwrap();
        let msgs = [ChatMessage::new("user", "hi")];
        let plain = t.render(&msgs, true, None, &TemplateVars::new()).unwrap();
        assert_eq!(plain, "hi|medium");
        let mut vars = TemplateVars::new();
        vars.insert("enable_thinking".into(), serde_json::json!(false));
        vars.insert("reasoning_effort".into(), serde_json::json!("low"));
        vars.insert("messages".into(), serde_json::json!([{"content": "evil"}]));
        let out = t.render(&msgs, true, None, &vars).unwrap();
        assert_eq!(out, "hi|<think></think>low");
    }

    #[test]
    fn gemma_fallback_and_missing_template() {
        let t = ChatTemplate::new(None, "gemma3", "<bos>", "<eos>").unwrap();
        let out = t
            .render(
                &[
                    ChatMessage::new("system", "Be brief."),
                    ChatMessage::new("user", "Hi"),
                ],
                true,
                None,
                &TemplateVars::new(),
            )
            .unwrap();
        assert_eq!(
            out,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        assert!(matches!(
            ChatTemplate::new(None, "llama", "", ""),
            Err(ChatError::NoTemplate(_))
        ));
    }
}
