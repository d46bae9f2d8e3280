//! The `weights.bump` container format (C-Kernel-Engine).
