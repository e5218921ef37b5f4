# The shipped Debian packages under a real systemd booted in namespaces of its
# own (tests/system/systemd_check.sh): as root with overlayfs, else skipped
# (exit code 77) with the reason. Builds the packages when no build of the
# same sources is cached in tests/system/debs (or $GM_SYSTEM_DEBS names one).
add_test(NAME system_systemd COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/systemd_check.sh ${PROJECT_SOURCE_DIR}
                                     ${PROJECT_BINARY_DIR})
set_tests_properties(system_systemd PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1200 LABELS system)

# Where the built daemon keeps its socket and quotas, by hand and under
# systemd's RUNTIME_DIRECTORY / STATE_DIRECTORY (tests/system/dirs_check.sh).
add_test(NAME system_dirs COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/dirs_check.sh $<TARGET_FILE:gpumemd>
                                  $<TARGET_FILE:gpumemctl>)
set_tests_properties(system_dirs PROPERTIES TIMEOUT 120 LABELS system)
