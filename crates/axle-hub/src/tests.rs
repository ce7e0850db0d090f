//! Pulls against the local Hub lookalike: the same code path as against the real Hub, only the
//! endpoint differs.
use crate::mock::MockHub;
use crate::*;

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn files(list: &[(&str, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    list.iter()
        .map(|(n, b)| (n.to_string(), b.clone()))
        .collect()
}

fn sha256(content: &[u8]) -> String {
    use sha2::Digest as _;
    crate::download::hex(&sha2::Sha256::digest(content))
}

fn id(text: &str) -> HubId {
    HubId::parse(text).expect("id")
}

struct Counted {
    started: Vec<(String, u64)>,
    bytes: u64,
    notes: Vec<String>,
}

impl Progress for Counted {
    fn file(&mut self, name: &str, _size: u64, done: u64) {
        self.started.push((name.to_string(), done));
    }
    fn advance(&mut self, bytes: u64) {
        self.bytes += bytes;
    }
    fn done(&mut self, _: &str) {}
    fn note(&mut self, message: &str) {
        self.notes.push(message.to_string());
    }
}

fn counted() -> Counted {
    Counted {
        started: vec![],
        bytes: 0,
        notes: vec![],
    }
}

fn setup() -> (MockHub, tempfile::TempDir, Hub) {
    let mock = MockHub::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let hub = Hub::new(mock.endpoint(), Cache::new(dir.path().join("hub")));
    (mock, dir, hub)
}

#[test]
fn gguf_repository_one_quantization() {
    let (mock, _dir, hub) = setup();
    let q4 = bytes(3000, 1);
    let commit = mock.add(
        "org/m-GGUF",
        files(&[
            ("README.md", b"# m".to_vec()),
            ("m-Q4_K_M.gguf", q4.clone()),
            ("m-Q8_0.gguf", bytes(5000, 2)),
        ]),
    );
    let mut p = counted();
    let pulled = hub
        .pull(&id("org/m-GGUF:q4_k_m"), Recheck::Hash, &mut p)
        .unwrap();
    assert_eq!(pulled.format, Format::Gguf);
    assert_eq!(pulled.commit, commit);
    assert_eq!(pulled.source(), format!("hf:org/m-GGUF@{commit}"));
    assert_eq!(std::fs::read(&pulled.path).unwrap(), q4);
    assert_eq!(pulled.downloaded, 3000);
    // The standard layout: a relative link into blobs named by the sha256, and the ref.
    let link = std::fs::read_link(&pulled.path).unwrap();
    assert!(link.starts_with("../../blobs"), "{}", link.display());
    let main = hub.cache().root().join("models--org--m-GGUF/refs/main");
    assert_eq!(std::fs::read_to_string(main).unwrap(), commit);
    // Only the asked file came.
    assert!(!mock
        .log()
        .iter()
        .any(|l| l.contains("Q8_0") || l.contains("README")));
    // Again: nothing is downloaded; offline finds it.
    let again = hub
        .pull(&id("org/m-GGUF:Q4_K_M"), Recheck::Hash, &mut counted())
        .unwrap();
    assert_eq!(again.downloaded, 0);
    let off = hub.clone().offline(true);
    let cached = off
        .resolve(&id("org/m-GGUF:Q4_K_M"), &mut counted())
        .unwrap();
    assert_eq!(cached.path, pulled.path);
    let e = off
        .resolve(&id("org/m-GGUF:Q8_0"), &mut counted())
        .unwrap_err();
    assert!(e.to_string().contains("Q8_0"), "{e}");
    // The listing and removal.
    let rows = hub.list();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].name, "org/m-GGUF:Q4_K_M");
    assert_eq!(rows[0].size(), 3000);
    let removed = hub.remove(&id("org/m-GGUF")).unwrap();
    assert_eq!(
        removed,
        Removed {
            files: 1,
            bytes: 3000
        }
    );
    assert!(hub.list().is_empty());
    assert!(hub.remove(&id("org/m-GGUF")).is_err());
}

#[test]
fn split_gguf_and_sharded_safetensors() {
    let (mock, _dir, hub) = setup();
    let parts = files(&[
        ("m-Q8_0-00001-of-00002.gguf", bytes(2000, 3)),
        ("m-Q8_0-00002-of-00002.gguf", bytes(1500, 4)),
    ]);
    mock.add("org/split", parts);
    let pulled = hub
        .pull(&id("org/split"), Recheck::Hash, &mut counted())
        .unwrap();
    assert_eq!(pulled.files.len(), 2);
    assert!(pulled.path.ends_with("m-Q8_0-00001-of-00002.gguf"));
    let index = serde_json::json!({ "weight_map": {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors",
    }});
    mock.add(
        "org/st",
        files(&[
            ("config.json", br#"{"model_type":"llama"}"#.to_vec()),
            ("tokenizer.json", b"{}".to_vec()),
            (
                "model.safetensors.index.json",
                index.to_string().into_bytes(),
            ),
            ("model-00001-of-00002.safetensors", bytes(4000, 5)),
            ("model-00002-of-00002.safetensors", bytes(1000, 6)),
            (".gitattributes", b"*.safetensors filter=lfs".to_vec()),
        ]),
    );
    let st = hub
        .pull(&id("org/st"), Recheck::Size, &mut counted())
        .unwrap();
    assert_eq!(st.format, Format::Safetensors);
    assert_eq!(st.files.len(), 5);
    assert!(st.path.join("config.json").is_file());
    assert!(st.path.join("model-00002-of-00002.safetensors").is_file());
    // A missing shard makes the cached copy incomplete, offline; a pull fetches it again.
    std::fs::remove_file(st.path.join("model-00002-of-00002.safetensors")).unwrap();
    let e = hub
        .clone()
        .offline(true)
        .resolve(&id("org/st"), &mut counted())
        .unwrap_err();
    assert!(
        e.to_string().contains("model-00002-of-00002.safetensors"),
        "{e}"
    );
    let again = hub
        .pull(&id("org/st"), Recheck::Size, &mut counted())
        .unwrap();
    assert_eq!(
        again.downloaded, 0,
        "the blob is still there; only the link was lost"
    );
    let names: Vec<String> = hub.list().into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["org/split:Q8_0", "org/st"]);
}

#[test]
fn a_cut_download_resumes_where_it_stopped() {
    let (mock, _dir, hub) = setup();
    let content = bytes(10_000, 7);
    mock.add("org/m", files(&[("m-Q4_0.gguf", content.clone())]));
    mock.cut_next("m-Q4_0.gguf", 4096);
    let mut p = counted();
    let pulled = hub.pull(&id("org/m"), Recheck::Hash, &mut p).unwrap();
    assert_eq!(std::fs::read(&pulled.path).unwrap(), content);
    let log = mock.log();
    assert!(
        log.iter().any(|l| l.ends_with("m-Q4_0.gguf bytes=4096-")),
        "{log:?}"
    );
    assert!(
        p.notes.iter().any(|n| n.contains("resuming")),
        "{:?}",
        p.notes
    );
    assert_eq!(p.bytes, 10_000, "no byte downloaded twice");
    // A partial file from an earlier process is resumed too, and never linked before that.
    mock.add("org/n", files(&[("n-Q4_0.gguf", content.clone())]));
    let sha = sha256(&content);
    let partial = hub
        .cache()
        .root()
        .join(format!("models--org--n/blobs/{sha}.incomplete"));
    std::fs::create_dir_all(partial.parent().unwrap()).unwrap();
    std::fs::write(&partial, &content[..2500]).unwrap();
    assert!(hub.clone().offline(true).cached(&id("org/n")).is_err());
    let pulled = hub
        .pull(&id("org/n"), Recheck::Hash, &mut counted())
        .unwrap();
    assert_eq!(pulled.downloaded, 10_000 - 2500);
    assert!(mock
        .log()
        .iter()
        .any(|l| l.ends_with("n-Q4_0.gguf bytes=2500-")));
    assert!(!partial.exists());
}

#[test]
fn a_corrupted_file_is_refused_and_fetched_again() {
    let (mock, _dir, hub) = setup();
    let content = bytes(5000, 9);
    mock.add(
        "org/m",
        files(&[
            ("config.json", br#"{"model_type":"qwen3"}"#.to_vec()),
            ("model.safetensors", content.clone()),
        ]),
    );
    mock.corrupt_next("model.safetensors", 1);
    mock.corrupt_next("config.json", 1);
    let mut p = counted();
    let pulled = hub.pull(&id("org/m"), Recheck::Hash, &mut p).unwrap();
    assert_eq!(
        std::fs::read(pulled.path.join("model.safetensors")).unwrap(),
        content
    );
    assert_eq!(
        p.notes.iter().filter(|n| n.contains("corrupted")).count(),
        2,
        "{:?}",
        p.notes
    );
    // Corrupted every time: refused, nothing linked, nothing left behind.
    mock.add("org/bad", files(&[("m-Q4_0.gguf", content.clone())]));
    mock.corrupt_next("m-Q4_0.gguf", 9);
    let e = hub
        .pull(&id("org/bad"), Recheck::Hash, &mut counted())
        .unwrap_err();
    assert!(matches!(e, HubError::Corrupted { .. }), "{e}");
    let blobs = hub.cache().root().join("models--org--bad/blobs");
    let left: Vec<_> = std::fs::read_dir(&blobs)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(hub.clone().offline(true).cached(&id("org/bad")).is_err());
    // A cached blob damaged later: `pull` (hash recheck) notices and fetches it again.
    mock.corrupt_next("m-Q4_0.gguf", 0);
    let good = hub
        .pull(&id("org/bad"), Recheck::Hash, &mut counted())
        .unwrap();
    let blob = std::fs::canonicalize(&good.path).unwrap();
    let mut damaged = std::fs::read(&blob).unwrap();
    damaged[10] ^= 1;
    std::fs::write(&blob, damaged).unwrap();
    let mut p = counted();
    let again = hub.pull(&id("org/bad"), Recheck::Hash, &mut p).unwrap();
    assert_eq!(again.downloaded, 5000);
    assert!(
        p.notes.iter().any(|n| n.contains("damaged")),
        "{:?}",
        p.notes
    );
    assert_eq!(std::fs::read(&again.path).unwrap(), content);
}

#[test]
fn unknown_gated_and_offline_are_refused_clearly() {
    let (mock, dir, hub) = setup();
    let e = hub
        .pull(&id("org/none"), Recheck::Size, &mut counted())
        .unwrap_err();
    assert!(matches!(e, HubError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("org/none was not found") && e.to_string().contains("HF_TOKEN"));
    mock.add_gated(
        "org/gated",
        files(&[("g-Q4_0.gguf", bytes(100, 1))]),
        "secret",
    );
    let e = hub
        .pull(&id("org/gated"), Recheck::Size, &mut counted())
        .unwrap_err();
    assert!(matches!(e, HubError::Gated { token: false, .. }), "{e}");
    assert!(e.to_string().contains("accept its terms"), "{e}");
    let wrong = hub.clone().with_token(Some("nope".into()));
    let e = wrong
        .pull(&id("org/gated"), Recheck::Size, &mut counted())
        .unwrap_err();
    assert!(matches!(e, HubError::Gated { token: true, .. }), "{e}");
    let right = hub.clone().with_token(Some("secret".into()));
    right
        .pull(&id("org/gated"), Recheck::Size, &mut counted())
        .unwrap();
    let e = hub.pull(&id("org/gated@v9"), Recheck::Size, &mut counted());
    assert!(e.is_err());
    // Offline without the files: refused, with no request made.
    let before = mock.log().len();
    let off = hub.clone().offline(true);
    let e = off.resolve(&id("org/other"), &mut counted()).unwrap_err();
    assert!(matches!(e, HubError::NotCached { .. }), "{e}");
    assert!(
        e.to_string().contains(&dir.path().display().to_string()),
        "{e}"
    );
    assert!(off
        .pull(&id("org/other"), Recheck::Size, &mut counted())
        .is_err());
    // Offline with them: found (the gated one, pulled above with the token).
    off.resolve(&id("org/gated"), &mut counted()).unwrap();
    assert_eq!(mock.log().len(), before);
    // An unreachable endpoint falls back to the cache with a note, or fails naming it.
    let down = Hub::new("http://127.0.0.1:9", hub.cache().clone());
    let mut p = counted();
    down.resolve(&id("org/gated"), &mut p).unwrap();
    assert!(
        p.notes.iter().any(|n| n.contains("cannot reach")),
        "{:?}",
        p.notes
    );
    let e = down.resolve(&id("org/other"), &mut counted()).unwrap_err();
    assert!(matches!(e, HubError::Unreachable { .. }), "{e}");
}

#[test]
fn files_another_tool_downloaded_are_reused() {
    let (mock, _dir, hub) = setup();
    let content = bytes(6000, 11);
    let commit = mock.add("org/m", files(&[("m-Q4_K_M.gguf", content.clone())]));
    // Lay the file out as huggingface_hub does.
    let sha = sha256(&content);
    let repo = hub.cache().root().join("models--org--m");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join(format!("snapshots/{commit}"))).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join(format!("blobs/{sha}")), &content).unwrap();
    std::os::unix::fs::symlink(
        format!("../../blobs/{sha}"),
        repo.join(format!("snapshots/{commit}/m-Q4_K_M.gguf")),
    )
    .unwrap();
    std::fs::write(repo.join("refs/main"), &commit).unwrap();
    let pulled = hub
        .pull(&id("org/m"), Recheck::Hash, &mut counted())
        .unwrap();
    assert_eq!(pulled.downloaded, 0);
    assert!(!mock.log().iter().any(|l| l.contains("/resolve/")));
}
