// Intentionally empty: a shared library target needs a source file of its
// own, and kiln's shared libraries are made of the static libraries of
// their layers, linked whole (cmake/SharedLibraries.cmake).
