include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS anvil trainer anvil_cli
  EXPORT anvilTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/anvil DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT anvilTargets NAMESPACE anvil:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/anvil)
configure_package_config_file(cmake/anvilConfig.cmake.in
  ${CMAKE_BINARY_DIR}/anvilConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/anvil)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/anvilConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/anvilConfig.cmake ${CMAKE_BINARY_DIR}/anvilConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/anvil)
