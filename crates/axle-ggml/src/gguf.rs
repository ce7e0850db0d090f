//! GGUF reading: metadata into plain Rust values, tensor descriptions, and the file mmap'd so that
//! weights can be used in place. Parsing is ggml's own (`gguf_init_from_file`), checked before and
//! after: the magic first (a clear "not a GGUF file"), then that the data region is complete.
use crate::{DType, Error, Result};
use llama_cpp_sys_2 as sys;
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One metadata value of a GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Any unsigned integer type.
    UInt(u64),
    /// Any signed integer type.
    Int(i64),
    /// f32 or f64.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array of values.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    fn kind(&self) -> &'static str {
        match self {
            MetaValue::UInt(_) => "unsigned integer",
            MetaValue::Int(_) => "integer",
            MetaValue::Float(_) => "float",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// The value as an integer, if it is one.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::UInt(v) => i64::try_from(v).ok(),
            MetaValue::Int(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a float (integers convert).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::Float(v) => Some(v),
            MetaValue::UInt(v) => Some(v as f64),
            MetaValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// GGUF tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape, ggml order (ne0 is the contiguous dimension); trailing ones dropped.
    pub shape: Vec<i64>,
    /// The part of a split model that holds it (0 for a model in one file).
    pub part: usize,
    /// Byte offset of the data from the start of its part's file.
    pub file_offset: u64,
    /// Size of the data in bytes.
    pub nbytes: u64,
}

impl TensorInfo {
    /// The layer the tensor belongs to (`blk.N.*`), if any.
    pub fn layer(&self) -> Option<u32> {
        self.name
            .strip_prefix("blk.")?
            .split('.')
            .next()?
            .parse()
            .ok()
    }
}

/// An opened GGUF model: metadata, tensor table and the mmap of each file. A model split over
/// several files (`name-00001-of-00003.gguf`, as llama.cpp's gguf-split writes them, metadata
/// `split.count`) is opened from its first part and reads as one: the metadata is the first
/// part's, the tensors are every part's.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    parts: Vec<Arc<Mmap>>,
}

/// One file of a model: its metadata, tensors and mapping.
struct Part {
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    mmap: Arc<Mmap>,
}

/// Maps a weights file of another format (safetensors) read-only, for [`GgufFile::assembled`].
pub fn map_file(path: &Path) -> Result<Arc<Mmap>> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let file = std::fs::File::open(path).map_err(io)?;
    map_opened(&file).map_err(io)
}

/// Maps a model file opened read-only.
fn map_opened(file: &std::fs::File) -> std::io::Result<Arc<Mmap>> {
    // SAFETY: the file is opened read-only; Axle never writes model files while they are mapped.
    // Another process truncating the file under us is outside what any mmap user can defend against.
    Ok(Arc::new(unsafe { Mmap::map(file) }?))
}

/// Tensor data made in memory (weights converted at load), laid out as GGUF lays it out (each
/// tensor at a multiple of 32 bytes) and mapped read-only like a file's at the end. Each piece is
/// freed as it is copied into the mapping, so the peak is the data's size and its largest
/// tensor's, not twice the data's.
#[derive(Debug, Default)]
pub struct MadeBytes {
    len: usize,
    pieces: Vec<(usize, Vec<u8>)>,
}

impl MadeBytes {
    /// Places one tensor's data; its offset in the mapping.
    pub fn place(&mut self, data: Vec<u8>) -> u64 {
        let at = self.len.next_multiple_of(32);
        self.len = at + data.len();
        self.pieces.push((at, data));
        at as u64
    }

    /// The mapping of everything placed.
    pub fn map(self) -> Result<Arc<Mmap>> {
        let io = |source| Error::Io {
            path: PathBuf::from("<converted weights>"),
            source,
        };
        let mut m = memmap2::MmapMut::map_anon(self.len.max(1)).map_err(io)?;
        for (at, piece) in self.pieces {
            m[at..at + piece.len()].copy_from_slice(&piece);
        }
        Ok(Arc::new(m.make_read_only().map_err(io)?))
    }
}

/// The path of part `no` (0-based) of a split model whose first part is `first`, in
/// llama.cpp's naming (`prefix-00001-of-00003.gguf`), if `first` is named so.
fn part_path(first: &Path, no: usize, count: usize) -> Option<PathBuf> {
    let name = first.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let suffix = format!("-00001-of-{count:05}");
    let prefix = stem.strip_suffix(&suffix)?;
    Some(first.with_file_name(format!("{prefix}-{:05}-of-{count:05}.gguf", no + 1)))
}

struct GgufCtx(*mut sys::gguf_context);
impl Drop for GgufCtx {
    fn drop(&mut self) {
        // SAFETY: the pointer came from gguf_init_from_file, is non-null and freed once.
        unsafe { sys::gguf_free(self.0) }
    }
}

fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: gguf returns NUL-terminated strings owned by the context, alive during this call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl GgufFile {
    /// Opens and validates a GGUF file, mmapping it; a split model's first part opens every
    /// part.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let first = Self::open_part(&path, 0)?;
        let malformed = |detail: String| Error::MalformedGguf {
            path: path.clone(),
            detail,
        };
        let int = |m: &BTreeMap<String, MetaValue>, k: &str| m.get(k).and_then(MetaValue::as_i64);
        let count = int(&first.metadata, "split.count").unwrap_or(1);
        let no = int(&first.metadata, "split.no").unwrap_or(0);
        if !(1..=9999).contains(&count) || !(0..count).contains(&no) {
            return Err(malformed(format!("split.no {no} of split.count {count}")));
        }
        if no != 0 {
            return Err(malformed(format!(
                "this is part {} of {count} of a split model: open the first part",
                no + 1
            )));
        }
        let count = count as usize;
        let Part {
            metadata,
            mut tensors,
            mmap,
        } = first;
        let mut parts = vec![mmap];
        for no in 1..count {
            let part_file = part_path(&path, no, count).ok_or_else(|| {
                malformed(format!(
                    "split.count is {count} but the name is not `<name>-00001-of-{count:05}.gguf`"
                ))
            })?;
            let part = Self::open_part(&part_file, no)?;
            let (pno, pcount) = (
                int(&part.metadata, "split.no"),
                int(&part.metadata, "split.count"),
            );
            if pno != Some(no as i64) || pcount != Some(count as i64) {
                return Err(Error::MalformedGguf {
                    path: part_file,
                    detail: format!(
                        "expected part {} of {count}, found split.no {pno:?} of split.count {pcount:?}",
                        no + 1
                    ),
                });
            }
            tensors.extend(part.tensors);
            parts.push(part.mmap);
        }
        if count > 1 {
            let listed = int(&metadata, "split.tensors.count");
            if listed.is_some_and(|n| n != tensors.len() as i64) {
                return Err(malformed(format!(
                    "split.tensors.count is {listed:?} but the {count} parts hold {} tensors",
                    tensors.len()
                )));
            }
            let mut names = std::collections::BTreeSet::new();
            if let Some(dup) = tensors.iter().find(|t| !names.insert(t.name.as_str())) {
                return Err(malformed(format!("tensor {} is in two parts", dup.name)));
            }
        }
        Ok(GgufFile {
            path,
            metadata,
            tensors,
            parts,
        })
    }

    /// A model assembled in memory from another format's files: its metadata (as GGUF keys),
    /// its tensors, and the mappings their bytes lie in (`TensorInfo::part` indexes `parts`).
    /// Each tensor is checked to lie inside its part and to hold what its type and shape take.
    pub fn assembled(
        path: PathBuf,
        metadata: BTreeMap<String, MetaValue>,
        tensors: Vec<TensorInfo>,
        parts: Vec<Arc<Mmap>>,
    ) -> Result<GgufFile> {
        let malformed = |detail: String| Error::MalformedGguf {
            path: path.clone(),
            detail,
        };
        let mut names = std::collections::BTreeSet::new();
        for t in &tensors {
            let part = parts
                .get(t.part)
                .ok_or_else(|| malformed(format!("{}: no part {}", t.name, t.part)))?;
            let end = t.file_offset.checked_add(t.nbytes);
            if end.is_none_or(|e| e > part.len() as u64) {
                return Err(malformed(format!(
                    "{}: its bytes lie outside its file",
                    t.name
                )));
            }
            let elements: i64 = t.shape.iter().product();
            let rows = elements / t.shape.first().copied().unwrap_or(1).max(1);
            let want = t.dtype.row_size(t.shape.first().copied().unwrap_or(1)) as u64 * rows as u64;
            if t.shape.iter().any(|&d| d <= 0) || want != t.nbytes {
                return Err(malformed(format!(
                    "{}: {} bytes for {:?} of {:?}",
                    t.name, t.nbytes, t.shape, t.dtype
                )));
            }
            if !names.insert(t.name.as_str()) {
                return Err(malformed(format!("tensor {} appears twice", t.name)));
            }
        }
        Ok(GgufFile {
            path,
            metadata,
            tensors,
            parts,
        })
    }

    /// This model with some tensors' data replaced: for each, its name, a new type and bytes for
    /// the same shape. The new bytes lie in one mapping of their own, after the model's. A
    /// mapping left holding less than a quarter of its bytes in use (the float weights a
    /// quantization replaced) gives the tensors still in it to the new mapping and is dropped,
    /// so that its memory goes.
    pub fn with_tensors_replaced(self, new: Vec<(String, DType, Vec<u8>)>) -> Result<GgufFile> {
        if new.is_empty() {
            return Ok(self);
        }
        let GgufFile {
            path,
            metadata,
            mut tensors,
            parts,
        } = self;
        let mut made = MadeBytes::default();
        let mut place = |data: Vec<u8>, t: &mut TensorInfo| {
            t.part = usize::MAX;
            t.nbytes = data.len() as u64;
            t.file_offset = made.place(data);
        };
        for (name, dtype, data) in new {
            let t = tensors
                .iter_mut()
                .find(|t| t.name == name)
                .ok_or_else(|| Error::MissingTensor(name.clone()))?;
            t.dtype = dtype;
            place(data, t);
        }
        let mut used = vec![0u64; parts.len()];
        for t in tensors.iter().filter(|t| t.part < parts.len()) {
            used[t.part] += t.nbytes;
        }
        let keep: Vec<bool> = parts
            .iter()
            .zip(&used)
            .map(|(p, &u)| u > 0 && u * 4 >= p.len() as u64)
            .collect();
        for t in tensors.iter_mut() {
            if t.part < parts.len() && !keep[t.part] {
                let from = &parts[t.part];
                place(
                    from[t.file_offset as usize..(t.file_offset + t.nbytes) as usize].to_vec(),
                    t,
                );
            }
        }
        // The kept mappings, renumbered in order, then the new one.
        let mut index = vec![usize::MAX; parts.len()];
        let mut kept = Vec::new();
        for (i, p) in parts.into_iter().enumerate() {
            if keep[i] {
                index[i] = kept.len();
                kept.push(p);
            }
        }
        let last = kept.len();
        for t in tensors.iter_mut() {
            t.part = if t.part == usize::MAX {
                last
            } else {
                index[t.part]
            };
        }
        kept.push(made.map()?);
        GgufFile::assembled(path, metadata, tensors, kept)
    }

    /// Opens one file, its tensors marked as part `part`.
    fn open_part(path: &Path, part: usize) -> Result<Part> {
        crate::quiet_logs();
        let path = path.to_path_buf();
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        // A FIFO, a device or a directory: opening one could block, or read forever.
        if !std::fs::metadata(&path).map_err(io)?.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let mut file = std::fs::File::open(&path).map_err(io)?;
        let file_size = file.metadata().map_err(io)?.len();
        let mut magic = [0u8; 4];
        let got = read_up_to(&mut file, &mut magic).map_err(io)?;
        if got < 4 || &magic != b"GGUF" {
            return Err(Error::NotGguf {
                path,
                magic: String::from_utf8_lossy(&magic[..got])
                    .escape_debug()
                    .to_string(),
            });
        }
        let cpath = CString::new(path.as_os_str().to_string_lossy().as_bytes()).map_err(|_| {
            Error::MalformedGguf {
                path: path.clone(),
                detail: "the path holds a NUL byte".into(),
            }
        })?;
        let params = sys::gguf_init_params {
            no_alloc: true,
            ctx: std::ptr::null_mut(),
        };
        let _ = crate::log::take_errors();
        // SAFETY: cpath is a valid C string; with ctx NULL no ggml context is created.
        let raw = unsafe { sys::gguf_init_from_file(cpath.as_ptr(), params) };
        if raw.is_null() {
            let detail = crate::log::take_errors()
                .map(|d| d.replace("gguf_init_from_file_impl: ", ""))
                .unwrap_or_else(|| "its header or metadata could not be parsed".into());
            return Err(Error::MalformedGguf { path, detail });
        }
        let ctx = GgufCtx(raw);
        let metadata = read_metadata(&ctx);
        let tensors = read_tensors(&ctx, part)?;
        let needed = tensors
            .iter()
            .map(|t| t.file_offset + t.nbytes)
            .max()
            .unwrap_or(0);
        if needed > file_size {
            return Err(Error::Truncated {
                path,
                needed,
                actual: file_size,
            });
        }
        Ok(Part {
            metadata,
            tensors,
            mmap: map_opened(&file).map_err(io)?,
        })
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size in bytes (of all parts).
    pub fn file_size(&self) -> u64 {
        self.parts.iter().map(|m| m.len() as u64).sum()
    }

    /// How many files the model is split over (1 for one file).
    pub fn part_count(&self) -> usize {
        self.parts.len()
    }

    /// All metadata.
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Layers the tensors hold: one more than the highest `blk.N` index (0 without any).
    pub fn layers_in_tensors(&self) -> u32 {
        self.tensors
            .iter()
            .filter_map(TensorInfo::layer)
            .max()
            .map_or(0, |l| l + 1)
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor (from its part's mmap).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.parts[info.part][info.file_offset as usize..(info.file_offset + info.nbytes) as usize]
    }

    /// The mapping of part `part`.
    pub(crate) fn mmap(&self, part: usize) -> &Arc<Mmap> {
        &self.parts[part]
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn typed<'s, T>(
        &'s self,
        key: &str,
        expected: &'static str,
        f: impl Fn(&'s MetaValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or(Error::KeyType {
                key: key.into(),
                found: v.kind(),
                expected,
            }),
        }
    }

    /// An optional string value.
    pub fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "string", |v| match v {
            MetaValue::Str(s) => Some(s.as_str()),
            _ => None,
        })
    }

    /// A required string value.
    pub fn str(&self, key: &str) -> Result<&str> {
        self.str_opt(key)?
            .ok_or_else(|| Error::MissingKey(key.into()))
    }

    /// An optional integer value (any integer type).
    pub fn int_opt(&self, key: &str) -> Result<Option<i64>> {
        self.typed(key, "integer", MetaValue::as_i64)
    }

    /// A required integer value.
    pub fn int(&self, key: &str) -> Result<i64> {
        self.int_opt(key)?
            .ok_or_else(|| Error::MissingKey(key.into()))
    }

    /// An optional float value (integers convert); NaN and infinities are refused naming the
    /// key (no hyperparameter of any model is one).
    pub fn float_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.typed(key, "float", MetaValue::as_f64)? {
            Some(value) if !value.is_finite() => Err(Error::KeyNotFinite {
                key: key.into(),
                value,
            }),
            v => Ok(v),
        }
    }

    /// An optional bool value.
    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "bool", |v| match v {
            MetaValue::Bool(b) => Some(*b),
            _ => None,
        })
    }

    /// An optional array value.
    pub fn array_opt(&self, key: &str) -> Result<Option<&[MetaValue]>> {
        self.typed(key, "array", |v| match v {
            MetaValue::Array(a) => Some(a.as_slice()),
            _ => None,
        })
    }
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn read_scalar(ctx: &GgufCtx, i: i64, ty: sys::gguf_type) -> MetaValue {
    let c = ctx.0;
    // SAFETY (all getters below): `i` is a valid key index of the live context and `ty` is the
    // type gguf reported for it, which is what each getter asserts.
    unsafe {
        match ty {
            sys::GGUF_TYPE_UINT8 => MetaValue::UInt(sys::gguf_get_val_u8(c, i) as u64),
            sys::GGUF_TYPE_INT8 => MetaValue::Int(sys::gguf_get_val_i8(c, i) as i64),
            sys::GGUF_TYPE_UINT16 => MetaValue::UInt(sys::gguf_get_val_u16(c, i) as u64),
            sys::GGUF_TYPE_INT16 => MetaValue::Int(sys::gguf_get_val_i16(c, i) as i64),
            sys::GGUF_TYPE_UINT32 => MetaValue::UInt(sys::gguf_get_val_u32(c, i) as u64),
            sys::GGUF_TYPE_INT32 => MetaValue::Int(sys::gguf_get_val_i32(c, i) as i64),
            sys::GGUF_TYPE_FLOAT32 => MetaValue::Float(sys::gguf_get_val_f32(c, i) as f64),
            sys::GGUF_TYPE_BOOL => MetaValue::Bool(sys::gguf_get_val_bool(c, i)),
            sys::GGUF_TYPE_STRING => MetaValue::Str(cstr(sys::gguf_get_val_str(c, i))),
            sys::GGUF_TYPE_UINT64 => MetaValue::UInt(sys::gguf_get_val_u64(c, i)),
            sys::GGUF_TYPE_INT64 => MetaValue::Int(sys::gguf_get_val_i64(c, i)),
            sys::GGUF_TYPE_FLOAT64 => MetaValue::Float(sys::gguf_get_val_f64(c, i)),
            _ => MetaValue::Array(Vec::new()),
        }
    }
}

fn read_array(ctx: &GgufCtx, i: i64) -> MetaValue {
    let c = ctx.0;
    // SAFETY: `i` is an array-typed key of the live context.
    let (ty, n) = unsafe { (sys::gguf_get_arr_type(c, i), sys::gguf_get_arr_n(c, i)) };
    if ty == sys::GGUF_TYPE_STRING {
        // SAFETY: j < n for a string array.
        let v = (0..n)
            .map(|j| MetaValue::Str(cstr(unsafe { sys::gguf_get_arr_str(c, i, j) })))
            .collect();
        return MetaValue::Array(v);
    }
    if ty == sys::GGUF_TYPE_ARRAY {
        // Nested arrays do not occur in the models we load; keep the count only.
        return MetaValue::Array(Vec::new());
    }
    // SAFETY: for non-string arrays gguf returns a pointer to n packed elements of type `ty`.
    let data = unsafe { sys::gguf_get_arr_data(c, i) };
    macro_rules! arr {
        ($t:ty, $wrap:expr) => {{
            // SAFETY: data points to n elements of $t (the array's element type), alive with ctx.
            let s = unsafe { std::slice::from_raw_parts(data as *const $t, n) };
            MetaValue::Array(s.iter().map(|&x| $wrap(x)).collect())
        }};
    }
    match ty {
        sys::GGUF_TYPE_UINT8 => arr!(u8, |x: u8| MetaValue::UInt(x as u64)),
        sys::GGUF_TYPE_INT8 => arr!(i8, |x: i8| MetaValue::Int(x as i64)),
        sys::GGUF_TYPE_UINT16 => arr!(u16, |x: u16| MetaValue::UInt(x as u64)),
        sys::GGUF_TYPE_INT16 => arr!(i16, |x: i16| MetaValue::Int(x as i64)),
        sys::GGUF_TYPE_UINT32 => arr!(u32, |x: u32| MetaValue::UInt(x as u64)),
        sys::GGUF_TYPE_INT32 => arr!(i32, |x: i32| MetaValue::Int(x as i64)),
        sys::GGUF_TYPE_FLOAT32 => arr!(f32, |x: f32| MetaValue::Float(x as f64)),
        sys::GGUF_TYPE_BOOL => arr!(u8, |x: u8| MetaValue::Bool(x != 0)),
        sys::GGUF_TYPE_UINT64 => arr!(u64, MetaValue::UInt),
        sys::GGUF_TYPE_INT64 => arr!(i64, MetaValue::Int),
        sys::GGUF_TYPE_FLOAT64 => arr!(f64, MetaValue::Float),
        _ => MetaValue::Array(Vec::new()),
    }
}

fn read_metadata(ctx: &GgufCtx) -> BTreeMap<String, MetaValue> {
    let mut out = BTreeMap::new();
    // SAFETY: live context.
    let n = unsafe { sys::gguf_get_n_kv(ctx.0) };
    for i in 0..n {
        // SAFETY: i < n_kv.
        let (key, ty) = unsafe {
            (
                cstr(sys::gguf_get_key(ctx.0, i)),
                sys::gguf_get_kv_type(ctx.0, i),
            )
        };
        let v = if ty == sys::GGUF_TYPE_ARRAY {
            read_array(ctx, i)
        } else {
            read_scalar(ctx, i, ty)
        };
        out.insert(key, v);
    }
    out
}

fn read_tensors(ctx: &GgufCtx, part: usize) -> Result<Vec<TensorInfo>> {
    let c = ctx.0;
    // SAFETY: live context; all indices below are < n_tensors.
    let (n, data_offset) = unsafe { (sys::gguf_get_n_tensors(c), sys::gguf_get_data_offset(c)) };
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        // SAFETY: i < n_tensors; ne points to 4 i64 values owned by ctx.
        let (name, ty, off, size, ne) = unsafe {
            let ne = std::slice::from_raw_parts(sys::gguf_get_tensor_ne(c, i), 4).to_vec();
            (
                cstr(sys::gguf_get_tensor_name(c, i)),
                sys::gguf_get_tensor_type(c, i),
                sys::gguf_get_tensor_offset(c, i),
                sys::gguf_get_tensor_size(c, i),
                ne,
            )
        };
        let mut shape = ne;
        while shape.len() > 1 && shape[shape.len() - 1] == 1 {
            shape.pop();
        }
        let dtype = DType::from_raw(ty)
            .ok_or_else(|| Error::Alloc(format!("unknown ggml type {ty} for {name}")))?;
        out.push(TensorInfo {
            name,
            dtype,
            shape,
            part,
            file_offset: (data_offset + off) as u64,
            nbytes: size as u64,
        });
    }
    Ok(out)
}
