/* Status codes of the muon-offload C ABIs (muon_client.h, muon_reference.h): every function
 * returns MUON_OK (0), a non-negative result, or one of these negative codes. The finer cause
 * (an ErrorCode of core/error_code.hpp) is each library's *_last_error_code(). */
#ifndef MUON_STATUS_H_
#define MUON_STATUS_H_

enum {
  MUON_OK = 0,
  MUON_ERR_INVALID = -1,    /* bad argument (shape, name, range, options) */
  MUON_ERR_SERVER = -2,     /* the server refused or failed the request */
  MUON_ERR_CONNECTION = -3, /* the server is unreachable or the connection was lost */
  MUON_ERR_TIMEOUT = -4,    /* a wait ran past its timeout */
  MUON_ERR_NONFINITE = -5,  /* NaN/Inf in a gradient (policy error) */
  MUON_ERR_PEER_LOST = -6,  /* another rank of the job was lost mid-step */
  MUON_ERR_INTERNAL = -7,
  MUON_ERR_DEVICE = -8,     /* a CUDA call failed (e.g. no usable GPU: driver too old, no device) */
  MUON_ERR_UNAVAILABLE = -9 /* not available in this build (e.g. built without CUDA) */
};

#endif /* MUON_STATUS_H_ */
