//! A group of counters written down once.
//!
//! Each statistic the engine reports used to be spelled out five times:
//! the live atomic, the snapshot's field, the line copying one into the
//! other, a hand-written JSON key and the API schema. [`counter_group!`]
//! declares a group's fields once and derives the rest: the snapshot
//! struct (serde; its field names are the keys of `--stats-json` and
//! `GET /stats`), its live twin of relaxed atomics, the copy between them
//! and the sum of two snapshots. The schema (docs/api.yaml) and the
//! Prometheus names are checked against the serialized struct by tests in
//! vmm, so none of them can drift.
//!
//! A macro and not a derive crate: the fields are plain `u64` counters, so
//! a proc-macro crate (and its syn build) would buy nothing a
//! `macro_rules!` cannot do here.

/// Declares a counter group.
///
/// - `pub struct Name / AtomicName { field, ... }` defines `Name` (the
///   snapshot: `u64` fields, `Serialize`, `Deserialize`, `FIELDS`, `plus`)
///   and `AtomicName` (crate-private, `AtomicU64` fields, `snapshot`).
/// - `pub struct Name { field, ... }` defines the snapshot alone, for
///   counts gathered from elsewhere.
/// - The sectioned form, for a group that holds more than counts:
///   `counts { field, ... }` as above; `gauges { field: Type, ... }`, in
///   the snapshot only (the caller fills them; `snapshot` leaves them at
///   their default); `groups { field: Group / AtomicGroup, ... }`, nested
///   groups on both sides; `live { field: Type, ... }`, in the atomic twin
///   only (histograms and the like that the caller snapshots itself).
///   Attributes on a field (`#[serde(rename = ...)]`, docs) go to the
///   snapshot's field.
macro_rules! counter_group {
    (
        $(#[$meta:meta])*
        pub struct $name:ident / $atomic:ident {
            counts { $( $(#[$count_meta:meta])* $count:ident, )* }
            gauges { $( $(#[$gauge_meta:meta])* $gauge:ident : $gauge_ty:ty, )* }
            groups { $( $(#[$group_meta:meta])* $group:ident : $group_ty:ident / $group_atomic:ident, )* }
            live { $( $(#[$live_meta:meta])* $live:ident : $live_ty:ty, )* }
        }
    ) => {
        // Unknown keys are allowed here (unlike the plain groups) because
        // a gauge may serialize a summary that is not read back (a
        // histogram's percentiles): a stats object must still read.
        $(#[$meta])*
        #[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
        pub struct $name {
            $( $(#[$count_meta])* pub $count: u64, )*
            $( $(#[$gauge_meta])* pub $gauge: $gauge_ty, )*
            $( $(#[$group_meta])* pub $group: $group_ty, )*
        }

        #[doc = concat!("The live counters of [`", stringify!($name), "`]: relaxed atomics, bumped on the hot path.")]
        #[derive(Default)]
        pub(crate) struct $atomic {
            $(
                #[doc = concat!("[`", stringify!($name), "::", stringify!($count), "`].")]
                pub $count: ::std::sync::atomic::AtomicU64,
            )*
            $(
                #[doc = concat!("[`", stringify!($name), "::", stringify!($group), "`].")]
                pub $group: $group_atomic,
            )*
            $( $(#[$live_meta])* pub $live: $live_ty, )*
        }

        impl $atomic {
            /// The counts now, the gauges at their defaults (each count
            /// read on its own: not one atomic snapshot of the group).
            #[allow(clippy::needless_update)]
            pub fn snapshot(&self) -> $name {
                $name {
                    $( $count: self.$count.load(::std::sync::atomic::Ordering::Relaxed), )*
                    $( $group: self.$group.snapshot(), )*
                    ..$name::default()
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub struct $name:ident / $atomic:ident {
            $( $(#[$field_meta:meta])* $field:ident, )*
        }
    ) => {
        $crate::counter_group::counter_group! {
            $(#[$meta])*
            pub struct $name {
                $( $(#[$field_meta])* $field, )*
            }
        }

        #[doc = concat!("The live counters of [`", stringify!($name), "`]: relaxed atomics, bumped on the hot path.")]
        #[derive(Debug, Default)]
        pub(crate) struct $atomic {
            $(
                #[doc = concat!("[`", stringify!($name), "::", stringify!($field), "`].")]
                pub $field: ::std::sync::atomic::AtomicU64,
            )*
        }

        impl $atomic {
            /// The counts now (each read on its own: not one atomic
            /// snapshot of the group).
            #[allow(dead_code)]
            pub fn snapshot(&self) -> $name {
                $name {
                    $( $field: self.$field.load(::std::sync::atomic::Ordering::Relaxed), )*
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* $field:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $( $(#[$field_meta])* pub $field: u64, )*
        }

        impl $name {
            /// The field names, in declaration order: the JSON keys.
            #[allow(dead_code)]
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];

            /// The sum of two snapshots, field by field (a wrapper's own
            /// counts and its inner store's, or two runs).
            #[must_use]
            pub fn plus(self, other: $name) -> $name {
                $name {
                    $( $field: self.$field + other.$field, )*
                }
            }
        }
    };
}

pub(crate) use counter_group;

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    counter_group! {
        /// Two counts for the test.
        pub struct Pair / AtomicPair {
            /// The first.
            left,
            /// The second.
            right,
        }
    }

    #[test]
    fn one_declaration_gives_the_snapshot_its_atomics_its_keys_and_its_sum() {
        let live = AtomicPair::default();
        live.left.fetch_add(3, Ordering::Relaxed);
        live.right.fetch_add(5, Ordering::Relaxed);
        let snap = live.snapshot();
        assert_eq!(snap, Pair { left: 3, right: 5 });
        assert_eq!(
            snap.plus(Pair { left: 1, right: 2 }),
            Pair { left: 4, right: 7 }
        );
        assert_eq!(Pair::FIELDS, ["left", "right"]);
        assert_eq!(
            serde_json::to_value(snap).unwrap(),
            serde_json::json!({"left": 3, "right": 5})
        );
        let back: Pair = serde_json::from_str(r#"{"left": 3, "right": 5}"#).unwrap();
        assert_eq!(back, snap);
        assert!(
            serde_json::from_str::<Pair>(r#"{"left": 3, "right": 5, "extra": 1}"#).is_err(),
            "an unknown key is refused, so a renamed counter cannot be read as zero"
        );
    }
}
