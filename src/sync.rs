//! The one way this crate takes a `std::sync::Mutex`: [`lock`].
//!
//! Every mutex here guards state whose every change either completes or is undone before anything can panic
//! (a push, a swap, a counter moved), so a lock poisoned by a panic elsewhere still guards a consistent value.
//! Recovering it, rather than panicking in turn, keeps one failed task from taking every later caller down
//! with it. Critical sections are short and never span an `.await`, which is why these are `std` mutexes and
//! not tokio's.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, recovering it if a panic poisoned it (see the module doc for why that is sound here).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
