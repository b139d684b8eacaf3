# The quickstart job in fp32 and in bf16 (training.precision): training loss per step
# and validation loss every 50 steps (experiment_data.py precision). Call with
#   gnuplot -e "data='precision.dat'; out='precision.png'; title_text='...'" precision.gp
if (!exists("title_text")) title_text = "Loss in fp32 and bf16"
set terminal pngcairo size 900,420 font "DejaVu Sans,10"
set output out
set termoption noenhanced
set title title_text
set xlabel "step"
set ylabel "loss (nats per byte)"
set grid lc rgb "#eeeeee"
set yrange [2:4.5]  # the early spikes (to 8, steps 7-10) are cut off
set key top right box opaque
plot data using 1:2 with lines lw 1 lc rgb "#4C72B0" title "fp32 training", \
     data using 1:3 with lines lw 1 lc rgb "#DD8452" title "bf16 training", \
     data using 1:4 with linespoints pt 7 ps 0.8 lw 2 lc rgb "#1F3F7F" title "fp32 validation", \
     data using 1:5 with linespoints pt 5 ps 0.8 lw 2 lc rgb "#A04000" title "bf16 validation"
