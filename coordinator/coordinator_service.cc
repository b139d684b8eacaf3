#include "coordinator/coordinator_service.h"
