//! Serves files as a Hub repository on a local port until killed, to try `axle pull` by hand:
//! `cargo run -p axle-hub --features mock --example mock_hub -- org/repo FILE...`, then
//! `HF_ENDPOINT=<printed address> axle pull org/repo`.
fn main() {
    let mut args = std::env::args().skip(1);
    let Some(repo) = args.next() else {
        eprintln!("usage: mock_hub org/repo FILE...");
        std::process::exit(2);
    };
    let files = args
        .map(|f| {
            let path = std::path::PathBuf::from(&f);
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            match (name, std::fs::read(&path)) {
                (Some(name), Ok(bytes)) => (name, bytes),
                (_, Err(e)) => {
                    eprintln!("{f}: {e}");
                    std::process::exit(1);
                }
                (None, _) => {
                    eprintln!("{f}: not a file");
                    std::process::exit(1);
                }
            }
        })
        .collect();
    let hub = axle_hub::mock::MockHub::start();
    let commit = hub.add(&repo, files);
    println!("{} serves {repo} at {commit}", hub.endpoint());
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
