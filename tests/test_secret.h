// tests/test_secret.h: the shared secret of the clusters and hubs the tests start (loopback only, so inline in their
// configs; tests/e2e/e2e_util.py has the same value for the Python tests).
#ifndef DSERVE_TESTS_TEST_SECRET_H
#define DSERVE_TESTS_TEST_SECRET_H

#define DSERVE_TEST_SECRET "dc3c80b87648d296023e7386aece451e900f9b6bd254473a88a2fe5e7db030af"

#endif
