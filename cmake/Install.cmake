# `cmake --install BUILD --prefix PREFIX` lays out (docs/install.md):
#   PREFIX/include/kiln/          the public headers (C++ and the C API)
#   PREFIX/lib/libkiln_runtime.so, libkiln_compiler.so (+ SONAME links)
#   PREFIX/bin/kiln               the command
#   PREFIX/lib/cmake/kiln/        kilnConfig.cmake, kilnConfigVersion.cmake, kilnTargets.cmake
#   PREFIX/lib/pkgconfig/kiln.pc
# (lib is CMAKE_INSTALL_LIBDIR.)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kiln DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kiln_runtime_shared kiln_compiler_shared EXPORT kilnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kiln RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(KILN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kilnConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/kilnConfig.cmake INSTALL_DESTINATION ${KILN_CMAKE_DIR})
# While the major version is 0, a minor version is a compatibility boundary
# (CHANGELOG.md): find_package(kiln 0.2) accepts 0.2.x only.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(KILN_COMPATIBILITY SameMinorVersion)
else()
  set(KILN_COMPATIBILITY SameMajorVersion)
endif()
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kilnConfigVersion.cmake
                                 COMPATIBILITY ${KILN_COMPATIBILITY})
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kilnConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/kilnConfigVersion.cmake
        DESTINATION ${KILN_CMAKE_DIR})
configure_file(${CMAKE_CURRENT_LIST_DIR}/kiln.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kiln.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kiln.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
