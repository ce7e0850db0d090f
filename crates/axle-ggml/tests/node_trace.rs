//! `AXLE_TRACE_NODES`: one line per computed node, with a hash of its bytes (a test binary of its
//! own, since the variable holds for the whole process).
use axle_ggml::{Backend, Context, DType, GraphScheduler};

/// (graph, op, hash) of each line of the trace.
fn lines(path: &std::path::Path) -> Vec<(String, String, String)> {
    std::fs::read_to_string(path)
        .expect("trace written")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            // graph node op type [ne0, ne1, ne2, ne3] hash name
            (f[0].to_string(), f[2].to_string(), f[8].to_string())
        })
        .collect()
}

#[test]
fn traces_computed_nodes_and_their_bytes() {
    let dir = std::env::temp_dir().join(format!("axle-node-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("trace.txt");
    std::env::set_var("AXLE_TRACE_NODES", &path);

    let ctx = Context::new(16, 16).expect("context");
    let x = ctx.input(DType::F32, &[8, 4], "x");
    let sq = ctx.mul(x, x);
    let flat = ctx.reshape(sq, &[32]);
    let out = ctx.mul(flat, flat).named("out").as_output();
    let mut g = ctx.graph(16);
    g.expand(out);
    let mut sched = GraphScheduler::new(vec![Backend::cpu(1).expect("cpu")], 16).expect("sched");
    sched.alloc(0, &mut g).expect("alloc");
    for input in [1.5f32, 1.5, -0.5] {
        x.write(&[input; 32]).expect("write");
        sched.compute(0, &mut g).expect("compute");
    }

    let t = lines(&path);
    // Two products per graph; the reshape computes nothing and is left out.
    assert_eq!(t.len(), 6, "{t:?}");
    assert!(t.iter().all(|(_, op, _)| op == "MUL"), "{t:?}");
    let graphs: Vec<&str> = t.iter().map(|(g, _, _)| g.as_str()).collect();
    assert_eq!(graphs[0], graphs[1]);
    assert_ne!(graphs[1], graphs[2]);
    // The same input gives the same bytes, another input other bytes.
    assert_eq!(t[0].2, t[2].2);
    assert_eq!(t[1].2, t[3].2);
    assert_ne!(t[0].2, t[4].2);
    let _ = std::fs::remove_dir_all(&dir);
}
