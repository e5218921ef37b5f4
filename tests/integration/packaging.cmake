# Socket activation of the real gpumemd, and the packaging checks (units, man
# pages, .deb).
# Needs gpumemd to take its control socket from LISTEN_FDS (daemon/main.c).
find_program(SYSTEMD_SOCKET_ACTIVATE systemd-socket-activate PATHS /usr/bin /lib/systemd /usr/lib/systemd)
if(SYSTEMD_SOCKET_ACTIVATE)
  add_executable(test_sd_activation ${CMAKE_CURRENT_LIST_DIR}/test_sd_activation.c)
  target_link_libraries(test_sd_activation PRIVATE gm_testutil gpumem PkgConfig::CHECK)
  target_compile_definitions(test_sd_activation PRIVATE GPUMEMD_BIN="$<TARGET_FILE:gpumemd>"
                             SOCKET_ACTIVATE_BIN="${SYSTEMD_SOCKET_ACTIVATE}")
  add_dependencies(test_sd_activation gpumemd)
  add_test(NAME sd_activation COMMAND test_sd_activation)
  set_tests_properties(sd_activation PROPERTIES TIMEOUT 300)
else()
  message(STATUS "gpumemd: systemd-socket-activate not found (Debian package systemd): test sd_activation skipped")
endif()

# Units (systemd-analyze verify and security), man pages (groff), the Debian
# packages (dpkg-buildpackage, lintian, dpkg --root), their maintainer scripts
# and the Kubernetes manifest (python3-yaml). Each check skips (exit code 77) when its tool is missing.
set(GM_PACKAGING_CHECK ${CMAKE_CURRENT_LIST_DIR}/packaging_check.sh)
foreach(check units security man deb maintscripts k8s)
  add_test(NAME packaging_${check}
           COMMAND sh ${GM_PACKAGING_CHECK} ${check} ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR} $<TARGET_FILE:gpumemd>)
  set_tests_properties(packaging_${check} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()
