//! The machinery of [`store_operations!`](super::store_operations): the list read once into one
//! shape per trait, and the store traits defined from it.

/// Reads the list of store operations (see `store_operations!`) and calls `callback!` with one
/// group per trait, the lease trait first:
/// `{ [attributes] Trait [supertraits] [Mirror FLAG] [items that are not operations] operation* }`
/// (`FLAG` the trait's constant in `Capabilities`, `NONE` for the lease trait), each operation
/// as `[attributes] name self [argument: Type, ...] Answer [default body]`.
macro_rules! each_trait {
    (
        [$($callback:tt)*]
        $(#[$lease_meta:meta])*
        lease trait $lease:ident: [$($lease_super:tt)*] [$lease_dyn:ident $lease_flag:ident]
            { $($lease_ops:tt)* }
            also { $($also:tt)* }
        $(
            $(#[$cap_meta:meta])*
            capability trait $cap:ident [$cap_dyn:ident $cap_flag:ident] {
                $(
                    $(#[$op_meta:meta])*
                    fn $op:ident(&$self:ident $(, $arg:ident : $ty:ty)* $(,)?) -> $out:ty
                        $({ $($default:tt)* })? $(;)?
                )*
            }
        )*
    ) => {
        $crate::store::traits::define::each_trait!(@lease [$($callback)*]
            [[$(#[$lease_meta])*] $lease [$($lease_super)*] [$lease_dyn $lease_flag] [$($also)*]]
            [$(
                { [$(#[$cap_meta])*] $cap [$lease] [$cap_dyn $cap_flag] []
                    $([$(#[$op_meta])*] $op $self [$($arg : $ty),*] $out [$($($default)*)?])* }
            )*]
            $($lease_ops)*);
    };

    // The lease trait's operations, read as the capabilities' were above.
    (@lease [$($callback:tt)*] [$($lease:tt)*] [$($caps:tt)*]
        $(
            $(#[$op_meta:meta])*
            fn $op:ident(&$self:ident $(, $arg:ident : $ty:ty)* $(,)?) -> $out:ty
                $({ $($default:tt)* })? $(;)?
        )*
    ) => {
        $($callback)*! {
            { $($lease)* $([$(#[$op_meta])*] $op $self [$($arg : $ty),*] $out [$($($default)*)?])* }
            $($caps)*
        }
    };
}

/// Defines each trait of the list: every operation returns a `Send` future of a `StoreResult`,
/// with the lifetime `'a` of its borrowed arguments.
macro_rules! define_store_traits {
    ($({ [$($meta:tt)*] $trait:ident [$($super:tt)*] [$dyn:ident $flag:ident] [$($also:tt)*]
        $([$($op_meta:tt)*] $op:ident $self:ident [$($arg:ident : $ty:ty),*] $out:ty
            [$($default:tt)*])*
    })*) => {$(
        $($meta)*
        pub trait $trait: $($super)* {
            $(
                $crate::store::traits::define::define_store_traits!(@op [$($op_meta)*] $op $self
                    [$($arg : $ty),*] $out [$($default)*]);
            )*
            $($also)*
        }
    )*};

    (@op [$($meta:tt)*] $op:ident $self:ident [$($arg:ident : $ty:ty),*] $out:ty []) => {
        $($meta)*
        fn $op<'a>(&'a $self $(, $arg: $ty)*) -> impl Future<Output = StoreResult<$out>> + Send + 'a;
    };
    (@op [$($meta:tt)*] $op:ident $self:ident [$($arg:ident : $ty:ty),*] $out:ty
        [$($default:tt)+]) => {
        $($meta)*
        fn $op<'a>(&'a $self $(, $arg: $ty)*) -> impl Future<Output = StoreResult<$out>> + Send + 'a {
            $($default)+
        }
    };
}

pub(crate) use {define_store_traits, each_trait};
