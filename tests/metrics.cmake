# The Prometheus endpoint against a real gpumemd (host backend), and the
# packaged Prometheus configuration. promtool comes from Debian's prometheus
# package; without it the text is not linted and the config checks are skipped.
find_program(GM_PROMTOOL_EXECUTABLE promtool)
if(NOT GM_PROMTOOL_EXECUTABLE)
  message(WARNING "promtool not found (Debian package prometheus): metrics output and rules are not linted")
endif()

# The renderer and listener are also tested in process, on a synthetic daemon.
add_executable(test_metrics ${CMAKE_CURRENT_LIST_DIR}/test_metrics.c)
target_link_libraries(test_metrics PRIVATE gm_testutil gpumem gm_daemon PkgConfig::CHECK)
target_compile_definitions(test_metrics PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>")
if(GM_PROMTOOL_EXECUTABLE)
  target_compile_definitions(test_metrics PRIVATE GM_PROMTOOL="${GM_PROMTOOL_EXECUTABLE}")
endif()
add_dependencies(test_metrics gpumemd gpumemctl)
add_test(NAME metrics COMMAND test_metrics)
set_tests_properties(metrics PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=central" TIMEOUT 600)

if(GM_PROMTOOL_EXECUTABLE)
  set(GM_PROM_DIR ${CMAKE_SOURCE_DIR}/packaging/prometheus)
  add_test(NAME metrics_prometheus_rules
           COMMAND ${GM_PROMTOOL_EXECUTABLE} check rules ${GM_PROM_DIR}/gpumemd-alerts.yml)
  add_test(NAME metrics_prometheus_config
           COMMAND ${GM_PROMTOOL_EXECUTABLE} check config ${GM_PROM_DIR}/gpumemd-scrape.yml)
  # The alerts fire on what they name (rule unit tests).
  add_test(NAME metrics_prometheus_alerts
           COMMAND ${GM_PROMTOOL_EXECUTABLE} test rules metrics_alerts.test.yml
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
endif()
