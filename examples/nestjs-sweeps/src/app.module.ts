import { Module } from "@nestjs/common";
import { LeaseholdClient } from "@leasehold/client";

import { config } from "./config.js";
import { GigExpiryWorkerService, RepinWorkerService } from "./workers.js";

@Module({
  providers: [
    {
      provide: LeaseholdClient,
      // The sidecar beside this replica: $LEASEHOLD_SIDECAR, default http://127.0.0.1:7070.
      useFactory: () => new LeaseholdClient({ onSidecarDown: config.onSidecarDown }),
    },
    GigExpiryWorkerService,
    RepinWorkerService,
  ],
})
export class AppModule {}
