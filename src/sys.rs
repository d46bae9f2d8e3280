//! All operating-system calls live here.
