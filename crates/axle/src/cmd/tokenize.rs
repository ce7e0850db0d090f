//! `axle tokenize`: ids and pieces of a text, one per line.
use axle_models::Tokenizer;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// GGUF model file, or Hub id (`org/repo[:QUANT]`).
    #[arg(long)]
    model: PathBuf,
    /// Do not add BOS/EOS.
    #[arg(long)]
    no_special: bool,
    /// Do not parse special token texts (like <|im_start|>) in the input.
    #[arg(long)]
    no_parse_special: bool,
    /// The text.
    text: String,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    // Only the vocabulary is needed: read metadata, not weights.
    let file = axle_models::hf::open_model(&super::hub::local(&a.model)?.path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&a.text, !a.no_special, !a.no_parse_special);
    for id in &ids {
        let piece = String::from_utf8_lossy(&tok.piece(*id, true)).into_owned();
        println!("{id:>7} {piece:?}");
    }
    eprintln!("{} tokens", ids.len());
    Ok(())
}
