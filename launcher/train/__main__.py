from launcher.train.loop import exit_process, main

exit_process(main())
