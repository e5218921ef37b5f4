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
add_dependencies(test_metrics gpumemd gpumemctl gm-test-client)
add_test(NAME metrics COMMAND test_metrics)
set_tests_properties(metrics PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=central" TIMEOUT 600)
# The UUID label from the cuda backend (the emulated driver's device UUID).
if(GPUMEM_HAVE_CUDA)
  add_test(NAME metrics_cuda_uuid COMMAND test_metrics)
  add_dependencies(test_metrics fakecuda fakenvml)
  set_tests_properties(metrics_cuda_uuid PROPERTIES TIMEOUT 300 ENVIRONMENT
    "GPUMEM_TEST_BACKEND=cuda;GPUMEM_HEAP=central;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G;FAKECUDA_UUID_PREFIX=0123456789abcdef")
endif()

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

# Every alert has a summary, a description, a runbook section and a test case
# (python3-yaml); the Grafana dashboard's queries return data from a real
# Prometheus scraping a real daemon, which also evaluates the alert rules.
find_program(GM_PROMETHEUS_EXECUTABLE prometheus)
find_package(Python3 COMPONENTS Interpreter)
set(GM_MONITORING_CHECK ${CMAKE_CURRENT_LIST_DIR}/monitoring_check.py)
set(GM_PROM_RULES ${CMAKE_SOURCE_DIR}/packaging/prometheus/gpumemd-alerts.yml)
if(Python3_Interpreter_FOUND)
  add_test(NAME metrics_alerts_documented
           COMMAND ${Python3_EXECUTABLE} ${GM_MONITORING_CHECK} rules ${GM_PROM_RULES}
                   ${CMAKE_CURRENT_LIST_DIR}/metrics_alerts.test.yml ${CMAKE_SOURCE_DIR}/docs/runbook.md)
endif()
if(Python3_Interpreter_FOUND AND GM_PROMETHEUS_EXECUTABLE)
  add_test(NAME metrics_dashboard
           COMMAND ${Python3_EXECUTABLE} ${GM_MONITORING_CHECK} dashboard
                   ${CMAKE_SOURCE_DIR}/packaging/grafana/gpumemd-dashboard.json ${GM_PROM_RULES}
                   ${GM_PROMETHEUS_EXECUTABLE} $<TARGET_FILE:gpumemd> $<TARGET_FILE:gpumemctl>
                   $<TARGET_FILE:gm-test-client>)
  set_tests_properties(metrics_dashboard PROPERTIES TIMEOUT 120)
else()
  message(WARNING "prometheus or python3 not found (Debian packages prometheus, python3-yaml): the dashboard is not checked")
endif()
