# anvil_add_test_suites(TARGET FILTER <gtest filter> [PROPERTIES <ctest properties>...])
#
# One ctest entry per GoogleTest suite of TARGET that FILTER selects, where
# gtest_discover_tests makes one per test. Each entry is its own process, and
# starting the test binary (loading libtorch) costs about 0.45 s: measured
# 2026-11-28 on a 2-core AMD EPYC (family 25 model 17), 44 short tests took
# 11.7 s of wall time as 44 entries under `ctest -j2` and 3.6 s as one
# process (docs/reliability.md). A suite's tests share their file and their
# fixtures, so they run together as they do under `anvil_tests` alone.
#
# Like gtest_discover_tests, the list is read from the built binary after each
# link (`--gtest_list_tests`), so a new test needs no edit here. An entry's
# name is the suite's ("ConfigTest"); its output shows each test's result and
# time, and `anvil_tests --gtest_filter=Suite.Test` runs one test alone.
if(CMAKE_SCRIPT_MODE_FILE)
  # Script mode, after a link: EXE, FILTER, WORKDIR, PROPS (set_tests_properties' words, bracket-quoted), OUT.
  execute_process(COMMAND "${EXE}" --gtest_list_tests "--gtest_filter=${FILTER}"
                  WORKING_DIRECTORY "${WORKDIR}" OUTPUT_VARIABLE listing ERROR_VARIABLE err
                  RESULT_VARIABLE rc TIMEOUT 60)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}): ${err}")
  endif()
  # Each suite's tests by name, as the filter selects them (a suite may be split between two calls).
  string(REPLACE ";" "\\;" listing "${listing}")
  string(REPLACE "\n" ";" lines "${listing}")
  set(suites "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([^ #][^ ]*)\\.( |$)")  # a suite: column 0, its name ends in "." (maybe "# TypeParam")
      set(suite "${CMAKE_MATCH_1}")
      string(MAKE_C_IDENTIFIER "${suite}" var)
      list(APPEND suites "${suite}")
    elseif(line MATCHES "^  ([^ ]+)")  # a test of it (maybe "# GetParam() = ...")
      list(APPEND "tests_${var}" "${suite}.${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(content "")
  foreach(suite IN LISTS suites)
    string(MAKE_C_IDENTIFIER "${suite}" var)
    string(REPLACE ";" ":" names "${tests_${var}}")
    string(APPEND content "add_test([==[${suite}]==] [==[${EXE}]==] [==[--gtest_filter=${names}]==])\n"
                          "set_tests_properties([==[${suite}]==] PROPERTIES WORKING_DIRECTORY [==[${WORKDIR}]==] ${PROPS})\n")
  endforeach()
  file(WRITE "${OUT}" "${content}")
  return()
endif()

set(ANVIL_TEST_SUITES_SCRIPT ${CMAKE_CURRENT_LIST_FILE})

function(anvil_add_test_suites target)
  cmake_parse_arguments(A "" "FILTER;WORKING_DIRECTORY" "PROPERTIES" ${ARGN})
  string(MD5 tag "${A_FILTER}")
  string(SUBSTRING "${tag}" 0 8 tag)
  set(out "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_${tag}.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_${tag}_include.cmake")
  # The properties as text for set_tests_properties, each value bracket-quoted.
  set(props "")
  foreach(p IN LISTS A_PROPERTIES)
    string(APPEND props " [==[${p}]==]")
  endforeach()
  add_custom_command(
    TARGET ${target} POST_BUILD
    BYPRODUCTS "${out}"
    COMMAND "${CMAKE_COMMAND}" "-DEXE=$<TARGET_FILE:${target}>" "-DFILTER=${A_FILTER}"
            "-DWORKDIR=${A_WORKING_DIRECTORY}" "-DPROPS=${props}" "-DOUT=${out}" -P "${ANVIL_TEST_SUITES_SCRIPT}"
    VERBATIM)
  file(WRITE "${include_file}"
       "if(EXISTS \"${out}\")\n  include(\"${out}\")\nelse()\n  add_test(${target}_suites_NOT_BUILT ${target}_suites_NOT_BUILT)\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
