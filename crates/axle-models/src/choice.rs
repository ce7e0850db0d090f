//! Options named by a word on every surface (CLI flags, manifests, Python keywords, environment
//! variables): [`named_choice!`] gives such an enum its parsing and its display from one table,
//! and its parse errors list the names.

/// The value named `s` among `names` (in any case), or an error that lists them: "{what} are a, b or c, not
/// \"s\"".
pub(crate) fn parse<T: Copy>(s: &str, what: &str, names: &[(&str, T)]) -> Result<T, String> {
    if let Some(&(_, v)) = names.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
        return Ok(v);
    }
    let list: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
    let (last, rest) = list.split_last().expect("a choice has names");
    let list = match rest {
        [] => last.to_string(),
        _ => format!("{} or {last}", rest.join(", ")),
    };
    Err(format!("{what} are {list}, not {s:?}"))
}

/// The name of `value` in `names`.
pub(crate) fn name<T: PartialEq>(value: &T, names: &[(&'static str, T)]) -> &'static str {
    names
        .iter()
        .find(|(_, v)| v == value)
        .map(|(n, _)| *n)
        .expect("every value of a choice has a name")
}

/// `FromStr` (errors listing the names) and `Display` for an enum of named values:
/// `named_choice!(Type, "what they are called", { "name" => Type::Value, ... });`
macro_rules! named_choice {
    ($ty:ty, $what:literal, { $($name:literal => $value:expr),+ $(,)? }) => {
        impl std::str::FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                $crate::choice::parse(s, $what, &[$(($name, $value)),+])
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($crate::choice::name(self, &[$(($name, $value)),+]))
            }
        }
    };
}
pub(crate) use named_choice;

#[cfg(test)]
mod tests {
    use crate::device_step::DeviceProducts;
    use crate::kv::KvType;
    use crate::{FusedProjections, HostKernels, SplitMode};

    #[test]
    fn names_parse_back_and_errors_list_them() {
        for k in [
            HostKernels::Origin,
            HostKernels::Compatible,
            HostKernels::Tiled,
        ] {
            assert_eq!(k.to_string().parse::<HostKernels>(), Ok(k));
        }
        for p in [
            DeviceProducts::Groups,
            DeviceProducts::Wide,
            DeviceProducts::Columns,
        ] {
            assert_eq!(p.to_string().parse::<DeviceProducts>(), Ok(p));
        }
        assert_eq!("tensor".parse::<SplitMode>(), Ok(SplitMode::Tensor));
        assert_eq!(
            "fast".parse::<HostKernels>(),
            Err("host kernels are origin, compatible or tiled, not \"fast\"".to_string())
        );
        assert_eq!(
            "on".parse::<FusedProjections>(),
            Err("fused projections are off, devices or everywhere, not \"on\"".to_string())
        );
        assert_eq!(
            "row".parse::<SplitMode>(),
            Err("split modes are layer or tensor, not \"row\"".to_string())
        );
        for k in [KvType::F16, KvType::Q8_0] {
            assert_eq!(k.to_string().parse::<KvType>(), Ok(k));
        }
        assert_eq!(
            "q4_0".parse::<KvType>(),
            Err("KV types are f16 or q8_0, not \"q4_0\"".to_string())
        );
    }
}
