//! Why the worker is not ready while something it depends on is wrong but may heal: its lease
//! lost (it fenced itself), or the storage refusing writes (full, read-only). Whoever sees the
//! fault sets it; the next success clears it. `/readyz` answers 503 with the reasons.

use std::sync::Mutex;

use crate::store::StoreError;

#[derive(Debug, Default)]
pub(crate) struct Health {
    fenced: Mutex<Option<String>>,
    storage: Mutex<Option<String>>,
    /// What a ready worker says besides (other workers' lapsed leases), as last sampled.
    notes: Mutex<Vec<String>>,
}

impl Health {
    pub(crate) fn set_fenced(&self, why: Option<String>) {
        *self.fenced.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// Records `e` if it is a fault of the storage itself; says whether it was.
    pub(crate) fn storage_failed(&self, e: &StoreError) -> bool {
        let Some(fault) = e.fault() else { return false };
        let mut storage = self.storage.lock().unwrap_or_else(|e| e.into_inner());
        if storage.is_none() {
            tracing::error!(error = %e, "the storage refuses writes: {fault}; runs keep their results until it takes them");
        }
        *storage = Some(format!("{fault}: {e}"));
        true
    }

    /// A write went through.
    pub(crate) fn storage_ok(&self) {
        if self.storage.lock().unwrap_or_else(|e| e.into_inner()).take().is_some() {
            tracing::info!("the storage takes writes again");
        }
    }

    pub(crate) fn set_notes(&self, notes: Vec<String>) {
        *self.notes.lock().unwrap_or_else(|e| e.into_inner()) = notes;
    }

    pub(crate) fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What is wrong now, if anything.
    pub(crate) fn problems(&self) -> Vec<String> {
        let fenced = self.fenced.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let storage = self.storage.lock().unwrap_or_else(|e| e.into_inner()).clone();
        fenced.into_iter().chain(storage).collect()
    }
}
