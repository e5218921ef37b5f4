# Statistics that add up: allocated = freed + current and pools summing to
# "all", for the device, every tenant and every live process, through a storm
# of client exits and kills, in both heap modes.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  foreach(heap local central)
    add_test(NAME stats_storm_${heap}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/stats_storm.py $<TARGET_FILE:gpumemd>
                     $<TARGET_FILE:gpumemctl> $<TARGET_FILE:gm-test-client> ${heap})
    set_tests_properties(stats_storm_${heap} PROPERTIES TIMEOUT 300)
  endforeach()
endif()
